#!/usr/bin/env python3
"""Golden initial weights for `--rng torch` (tests/base/test_torch_init.c).

dtrain's `--rng torch` (dt_model_init_torch) starts a model from the
weights PyTorch gives it after torch.manual_seed(seed). For GPT-2 and Llama
"PyTorch's model" is transformers' GPT2LMHeadModel(config) and
LlamaForCausalLM(config): this script builds them and writes, for every
parameter, its element count, its first three and last two values and its
sum, one line per parameter:

    CASE NAME NUMEL H0 H1 H2 T1 T2 SUM

Cases (seed 0, dropout 0):
  gpt           dtrain's gpt-micro with --n-layer 3 --vocab-size 300
                (3 layers: the residual std 0.02/sqrt(6) is not a round
                number), GPT2Config(n_layer=3, n_head=2, n_embd=64,
                n_positions=64, vocab_size=300)
  llama         llama-tiny (untied head): LlamaConfig(vocab_size=512,
                hidden_size=64, intermediate_size=176, 2 layers, 4 heads,
                2 kv heads, head_dim 16, 128 positions)
  llama_bias    llama-tiny tied, with attention_bias and mlp_bias
  llama_pad     llama-tiny tied, pad_token_id 0: nn.Embedding's padding
                row starts at zero (the tied head's too)
  qwen2         the same sizes as Qwen2ForCausalLM(Qwen2Config(...)), tied:
                q/k/v biases, none on o_proj (dtrain: attention_bias with
                qkv_bias_only)
  phi3          the same sizes as Phi3ForCausalLM(Phi3Config(...)), untied:
                one qkv_proj and one gate_up_proj (dtrain: fused), no
                padding row
  gemma2        the same sizes as Gemma2ForCausalLM(Gemma2Config(...)): tied,
                pad_token_id 0 (Gemma2Config's), four norms a layer at 0
  olmo2         the same sizes as Olmo2ForCausalLM(Olmo2Config(...)): untied,
                pad_token_id 1 (Olmo2Config's), q_norm/k_norm over the whole
                projections
  gemma3        the same sizes as Gemma3ForCausalLM(Gemma3TextConfig(...)):
                tied, pad_token_id 0, Gemma 2's norms and q_norm/k_norm over
                each head, all at 0

Usage: $PEER_PYTHON scripts/make_init_goldens.py [tests/data/torch_init/goldens.txt]
(the file records the transformers and torch that wrote it).
"""
import os
import sys

import torch
import transformers
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          Olmo2Config, Olmo2ForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM)

transformers.logging.set_verbosity_error()


def llama_cfg(**kw):
    return LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                       rms_norm_eps=1e-5, initializer_range=0.02, **kw)


CASES = [
    ("gpt", lambda: GPT2LMHeadModel(GPT2Config(n_layer=3, n_head=2, n_embd=64, n_positions=64, vocab_size=300,
                                               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                               bos_token_id=0, eos_token_id=0))),
    ("llama", lambda: LlamaForCausalLM(llama_cfg(tie_word_embeddings=False))),
    ("llama_bias", lambda: LlamaForCausalLM(llama_cfg(tie_word_embeddings=True, attention_bias=True, mlp_bias=True))),
    ("llama_pad", lambda: LlamaForCausalLM(llama_cfg(tie_word_embeddings=True, pad_token_id=0))),
    ("qwen2", lambda: Qwen2ForCausalLM(Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=176,
                                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                   head_dim=16, max_position_embeddings=128, rms_norm_eps=1e-5,
                                                   initializer_range=0.02, tie_word_embeddings=True))),
    ("phi3", lambda: Phi3ForCausalLM(Phi3Config(vocab_size=512, hidden_size=64, intermediate_size=176,
                                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                max_position_embeddings=128, rms_norm_eps=1e-5,
                                                initializer_range=0.02, tie_word_embeddings=False,
                                                pad_token_id=None))),
    ("gemma2", lambda: Gemma2ForCausalLM(Gemma2Config(vocab_size=512, hidden_size=64, intermediate_size=176,
                                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                      head_dim=16, max_position_embeddings=128, rms_norm_eps=1e-5,
                                                      initializer_range=0.02))),
    ("olmo2", lambda: Olmo2ForCausalLM(Olmo2Config(vocab_size=512, hidden_size=64, intermediate_size=176,
                                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                   max_position_embeddings=128, rms_norm_eps=1e-5,
                                                   initializer_range=0.02))),
    ("gemma3", lambda: Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=512, hidden_size=64, intermediate_size=176,
                                                          num_hidden_layers=2, num_attention_heads=4,
                                                          num_key_value_heads=2, head_dim=16,
                                                          max_position_embeddings=128, rms_norm_eps=1e-5,
                                                          initializer_range=0.02))),
]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join("tests", "data", "torch_init", "goldens.txt")
    lines = [f"# scripts/make_init_goldens.py: transformers {transformers.__version__}, torch {torch.__version__}"]
    for case, make in CASES:
        torch.manual_seed(0)
        model = make()
        for name, p in model.named_parameters():  # a tied head is listed once, under the embedding's name
            x = p.detach().reshape(-1).double()
            vals = [x[0], x[1], x[2], x[-2], x[-1]]
            lines.append(f"{case} {name} {x.numel()} " + " ".join(f"{float(v):.9g}" for v in vals) +
                         f" {float(x.sum()):.17g}")
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, out)
    print(f"{out}: {len(lines) - 1} parameters")


if __name__ == "__main__":
    main()
