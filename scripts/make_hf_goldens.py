#!/usr/bin/env python3
"""Golden files for dtrain's Hugging Face parity tests (tests/nn/test_hf.c).

Makes, with transformers (5.x) and PyTorch, small random-init models saved
with save_pretrained, and what transformers computes on fixed tokens:

  llama/       LlamaForCausalLM: GQA (4 heads over 2 kv heads), head_dim 12
               != hidden/heads, untied head, llama3 rope scaling, f32,
               sharded (model.safetensors.index.json + 2 shards)
  llama_bf16/  the same weights saved in bf16, one file
  gpt2/        GPT2LMHeadModel, f32, one file
  qwen3/       Qwen3ForCausalLM (q_norm/k_norm over each head, GQA 4 over 2,
               head_dim 16 != hidden/heads, tied head), f32, one file; made
               last, from its own seed, so the files above do not change
  gemma/       GemmaForCausalLM (Gemma 1: embeddings times sqrt(hidden), the
               norms' (1 + weight) with the weights drawn away from 0, GELU
               tanh MLP, GQA 4 over 2, head_dim 16 != hidden/heads, tied
               head, pad_token_id 0 by GemmaConfig's default), f32, one file;
               made after all the others from its own seed; gemma_ref.safetensors
               as qwen3's
  phi3/        Phi3ForCausalLM (one qkv_proj and one gate_up_proj, GQA 4 over
               2, untied head, pad_token_id null: Phi3Config's 32000 is past
               this vocabulary), f32, one file; made last from its own seed;
               phi3_ref.safetensors as qwen3's
  phi4/        Phi3ForCausalLM as Phi-4-mini has it: partial_rotary_factor 0.75
               (12 of head_dim 16 rotate), longrope scaling (original 8 of 64
               positions), tied head; phi4_ref.safetensors as qwen3's, with
               logits_short [2, 8, V] of input_ids[:, :8] (the short factors)
  granite/     GraniteForCausalLM: embedding_multiplier 6, residual_multiplier
               0.3, attention_multiplier 0.2, logits_scaling 4, GQA 4 over 2,
               tied head; granite_ref.safetensors as qwen3's
  olmo2/       Olmo2ForCausalLM: norms after attention and MLP, q and k normalized
               over their whole projections (every norm weight drawn in [0.5,
               1.5]), GQA 4 over 2, untied head, pad_token_id 1;
               olmo2_ref.safetensors as qwen3's
  gemma2/      Gemma2ForCausalLM: a norm before and after attention and MLP,
               query_pre_attn_scalar 24 (not head_dim 16), attention scores
               soft-capped at 5 and logits at 2 (initializer_range 0.3 so
               that both caps bend), 3 layers (sliding, full, sliding) with
               sliding_window 16, GQA 4 over 2, tied head, pad_token_id 0;
               gemma2_ref.safetensors as qwen3's
  gemma3/      Gemma3ForCausalLM: Gemma 2's block with q_norm and k_norm (Gemma's
               1 + weight over each head) before RoPE, the sliding layers
               rotating with rope_local_base_freq 100, the full one with
               rope_theta 10000 under linear scaling (factor 4), 4 layers
               (sliding, sliding, full, sliding: sliding_window_pattern 3)
               with sliding_window 8 (so T = 16 slides), no soft caps,
               query_pre_attn_scalar 24, GQA 4 over 2, tied head;
               gemma3_ref.safetensors as qwen3's
  gemma3_mm/   Gemma3ForConditionalGeneration: gemma3's weights as the language
               model of an image-text model (a 1-layer vision tower of 16, 4
               image tokens), as transformers saves it (language_model.model.*,
               vision_tower.*, multi_modal_projector.*); on text its logits are
               gemma3's (checked here)
  smollm3/     SmolLM3ForCausalLM: the Llama block with NoPE layers (no_rope_layers
               [1, 0, 1]: the middle one attends without RoPE), rope_theta 2e6
               (SmolLM3Config's default, not written), GQA 4 over 2, attention
               biases, tied head, pad_token_id null; smollm3_ref.safetensors as
               qwen3's
  olmo3/       Olmo3ForCausalLM: OLMo 2's block with 4 layers (sliding, sliding,
               sliding, full) and sliding_window 8 (so T = 16 slides), the
               full layer rotating with rope_theta 10000 under linear scaling
               (factor 4), the sliding ones with 100 (rope_parameters, one
               object a kind), every norm weight drawn in [0.5, 1.5], GQA 4
               over 2, untied head; olmo3_ref.safetensors as qwen3's
  ministral/   MinistralForCausalLM: Mistral's block with layer_types (sliding,
               full, sliding) and sliding_window 8 (so T = 16 slides), GQA 4
               over 2, untied head; ministral_ref.safetensors as qwen3's
  mixtral/     MixtralForCausalLM: 2 layers of 4 experts (intermediate 48),
               2 a token, GQA 4 over 2, untied head; mixtral_ref.safetensors
               as qwen3's (the AdamW steps train the router too)
  qwen3_moe/   Qwen3MoeForCausalLM: 3 layers, the middle one dense
               (mlp_only_layers [1], intermediate 64), the others 8 experts
               (moe_intermediate_size 16), 3 a token, norm_topk_prob false,
               q/k norms, tied head; qwen3_moe_ref.safetensors as qwen3's
  qwen2_moe/   Qwen2MoeForCausalLM: 3 layers, the middle one sparse
               (decoder_sparse_step 2; the others dense, intermediate 64) with
               6 experts (16), 2 a token, norm_topk_prob true, and the shared
               expert (24) behind its sigmoid gate; q/k/v biases, untied head;
               qwen2_moe_ref.safetensors as qwen3's
  olmoe/       OlmoeForCausalLM: 2 layers of 5 experts (intermediate 16), 2 a
               token, not renormalised, q and k normalized over their whole
               projections, GQA 4 over 2, pad_token_id null, untied head;
               olmoe_ref.safetensors as qwen3's
  window_ref.safetensors:
               input_ids [2, 41]; mistral_logits, gemma2_logits [2, 40, V] of
               input_ids[:, :40] (past their sliding window of 16) and their
               losses; mistral_adamw_loss [10] on that batch
  llama_yarn_config.json, llama_yarn_ref.safetensors:
               llama's weights under YaRN rope scaling (factor 4, original 16
               positions, beta_fast 2, beta_slow 0.5, truncate false): the
               config and input_ids, logits, loss and adamw_loss
  llama_ref.safetensors, gpt2_ref.safetensors:
               input_ids [2, 17] (I64), logits [2, 16, V] of input_ids[:, :16]
               (F32, eval mode), loss [] (F32): mean next-token
               cross-entropy of those logits against input_ids[:, 1:];
               logits_bf16 for the bf16 weights (llama only);
               adamw_loss [10]: the losses of 10 AdamW steps (lr 1e-2,
               betas 0.9/0.999, eps 1e-8, weight decay 0.1) on that batch,
               each before its step (llama and qwen3)
  mistral/     MistralForCausalLM with sliding_window 16 (of 64 positions), f32;
               mistral_ref.safetensors: input_ids, logits and loss at T = 16
               (where the window is causal attention), eval (tokens.bin's)
  llama_pad_ref.safetensors:
               input_ids, and adamw_loss [10] of llama's weights under its config with
               pad_token_id = input_ids[0, 3] (nn.Embedding's padding_idx:
               that row gets no gradient from its lookups), and that id
  tokens.bin   llm.c token file (magic 20240520, version 1, uint16) of 161
               tokens, and eval_ref.safetensors: its mean next-token loss
               over the 10 disjoint 17-token windows (T = 16) for each model
               (qwen3's: the key "eval" of qwen3_ref.safetensors)

Usage: $PEER_PYTHON scripts/make_hf_goldens.py tests/data/hf
"""
import json
import os
import struct
import sys

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen3Config, Qwen3ForCausalLM, GemmaConfig, GemmaForCausalLM,
                          Phi3Config, Phi3ForCausalLM, GraniteConfig, GraniteForCausalLM, Olmo2Config,
                          Olmo2ForCausalLM, Gemma2Config, Gemma2ForCausalLM, Gemma3TextConfig, Gemma3ForCausalLM,
                          Gemma3Config, Gemma3ForConditionalGeneration, SiglipVisionConfig, SmolLM3Config,
                          SmolLM3ForCausalLM, Olmo3Config, Olmo3ForCausalLM, MinistralConfig,
                          MinistralForCausalLM, MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM, OlmoeConfig,
                          OlmoeForCausalLM)

out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/hf"
os.makedirs(out, exist_ok=True)
torch.manual_seed(1234)
V = 128
T = 16


def loss_of(logits, ids):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids.reshape(-1))


def windows_loss(model, toks):
    n = (len(toks) - 1) // T
    tot = 0.0
    with torch.no_grad():
        for w in range(n):
            x = torch.tensor(toks[w * T:w * T + T + 1]).unsqueeze(0)
            tot += loss_of(model(x[:, :T]).logits, x[:, 1:]).item()
    return tot / n


lc = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=64,
                 rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                 rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
                 bos_token_id=1, eos_token_id=2)
llama = LlamaForCausalLM(lc).eval()
gc = GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=2)
gpt2 = GPT2LMHeadModel(gc).eval()

ids = torch.randint(0, V, (2, T + 1), generator=torch.Generator().manual_seed(7))
toks = torch.randint(0, V, (10 * T + 1,), generator=torch.Generator().manual_seed(8)).tolist()
with open(os.path.join(out, "tokens.bin"), "wb") as f:
    hdr = [20240520, 1, len(toks)] + [0] * 253
    f.write(struct.pack("<256i", *hdr))
    f.write(np.array(toks, dtype=np.uint16).tobytes())

llama.save_pretrained(os.path.join(out, "llama"), max_shard_size="60KB")
gpt2.save_pretrained(os.path.join(out, "gpt2"))

refs = {}
for name, m in (("llama", llama), ("gpt2", gpt2)):
    with torch.no_grad():
        lg = m(ids[:, :T]).logits
    refs[name] = {"input_ids": ids.clone(), "logits": lg.contiguous(),
                  "loss": loss_of(lg, ids[:, 1:]).reshape([])}

# bf16 weights: saved in bf16, the reference runs them widened to f32
lb = LlamaForCausalLM(lc).eval()
lb.load_state_dict(llama.state_dict())
lb = lb.to(torch.bfloat16)
lb.save_pretrained(os.path.join(out, "llama_bf16"))
lb = lb.to(torch.float32)
with torch.no_grad():
    refs["llama"]["logits_bf16"] = lb(ids[:, :T]).logits.contiguous()


def adamw_losses(cls, cfg, model, batch=None):
    """10 AdamW steps on the fixed batch (f32; or the given one), the loss before each step"""
    b = ids if batch is None else batch
    tw = cls(cfg)
    tw.load_state_dict(model.state_dict())
    tw.train()
    opt = torch.optim.AdamW(tw.parameters(), lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    losses = []
    for _ in range(10):
        opt.zero_grad()
        l = loss_of(tw(b[:, :-1]).logits, b[:, 1:])
        losses.append(l.item())
        l.backward()
        opt.step()
    return torch.tensor(losses, dtype=torch.float32)


refs["llama"]["adamw_loss"] = adamw_losses(LlamaForCausalLM, lc, llama)

for name in refs:
    save_file(refs[name], os.path.join(out, name + "_ref.safetensors"))
save_file({"llama": torch.tensor(windows_loss(llama, toks), dtype=torch.float32).reshape([]),
           "gpt2": torch.tensor(windows_loss(gpt2, toks), dtype=torch.float32).reshape([])},
          os.path.join(out, "eval_ref.safetensors"))

# Qwen3: its own seed, after everything above (whose draws stay as they were)
torch.manual_seed(4321)
qc = Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                 rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
qwen3 = Qwen3ForCausalLM(qc).eval()
with torch.no_grad():  # the norms' weights away from 1, so that a missing norm shows
    for n, p in qwen3.named_parameters():
        if n.endswith("q_norm.weight") or n.endswith("k_norm.weight"):
            p.uniform_(0.5, 1.5)
qwen3.save_pretrained(os.path.join(out, "qwen3"))
with torch.no_grad():
    lg = qwen3(ids[:, :T]).logits
save_file({"input_ids": ids.clone(), "logits": lg.contiguous(), "loss": loss_of(lg, ids[:, 1:]).reshape([]),
           "adamw_loss": adamw_losses(Qwen3ForCausalLM, qc, qwen3),
           "eval": torch.tensor(windows_loss(qwen3, toks), dtype=torch.float32).reshape([])},
          os.path.join(out, "qwen3_ref.safetensors"))

# llama's weights under a config with pad_token_id = an id of the batch: nn.Embedding(padding_idx) passes no
# gradient to that row from its lookups (the test writes the config beside a copy of llama/)
pad = int(ids[0, 3])
lp = LlamaConfig(**{**lc.to_dict(), "pad_token_id": pad})
save_file({"input_ids": ids.clone(), "adamw_loss": adamw_losses(LlamaForCausalLM, lp, llama),
           "pad_token_id": torch.tensor(pad, dtype=torch.int64).reshape([])},
          os.path.join(out, "llama_pad_ref.safetensors"))

# Mistral with a sliding window of T = 16 positions (of 64): at T tokens it is causal attention
torch.manual_seed(5678)
mc = MistralConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=T,
                   rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
mistral = MistralForCausalLM(mc).eval()
mistral.save_pretrained(os.path.join(out, "mistral"))
with torch.no_grad():
    lg = mistral(ids[:, :T]).logits
save_file({"input_ids": ids.clone(), "logits": lg.contiguous(), "loss": loss_of(lg, ids[:, 1:]).reshape([]),
           "eval": torch.tensor(windows_loss(mistral, toks), dtype=torch.float32).reshape([])},
          os.path.join(out, "mistral_ref.safetensors"))

# Gemma 1: its own seed, after everything above (whose draws stay as they were); the RMSNorm weights (0 at
# init: GemmaRMSNorm multiplies by 1 + weight) drawn away from 0 so that the 1 + w shows
torch.manual_seed(8765)
gmc = GemmaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-6,
                  bos_token_id=1, eos_token_id=2)
gemma = GemmaForCausalLM(gmc).eval()
with torch.no_grad():
    for n, p in gemma.named_parameters():
        if n.endswith("norm.weight"):
            p.uniform_(-0.5, 0.5)
gemma.save_pretrained(os.path.join(out, "gemma"))
with torch.no_grad():
    lg = gemma(ids[:, :T]).logits
save_file({"input_ids": ids.clone(), "logits": lg.contiguous(), "loss": loss_of(lg, ids[:, 1:]).reshape([]),
           "adamw_loss": adamw_losses(GemmaForCausalLM, gmc, gemma),
           "eval": torch.tensor(windows_loss(gemma, toks), dtype=torch.float32).reshape([])},
          os.path.join(out, "gemma_ref.safetensors"))

# Phi-3: its own seed, after everything above
torch.manual_seed(4321)
pc = Phi3Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, original_max_position_embeddings=64,
                rms_norm_eps=1e-5, pad_token_id=None, bos_token_id=1, eos_token_id=2)
phi3 = Phi3ForCausalLM(pc).eval()
phi3.save_pretrained(os.path.join(out, "phi3"))
with torch.no_grad():
    lg = phi3(ids[:, :T]).logits
save_file({"input_ids": ids.clone(), "logits": lg.contiguous(), "loss": loss_of(lg, ids[:, 1:]).reshape([]),
           "adamw_loss": adamw_losses(Phi3ForCausalLM, pc, phi3),
           "eval": torch.tensor(windows_loss(phi3, toks), dtype=torch.float32).reshape([])},
          os.path.join(out, "phi3_ref.safetensors"))

# llama's weights under YaRN rope scaling (factor 4 over 16 original positions, beta_fast 2 and beta_slow 0.5
# without truncation: the ramp between extrapolation and interpolation has a fractional step; the attention
# factor 0.1 ln 4 + 1): the config is written to llama_yarn_config.json (the test puts it beside a copy of
# llama/'s weights), the reference to llama_yarn_ref.safetensors (logits, loss, adamw_loss)
yc = LlamaConfig(**{**lc.to_dict(), "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                                         "original_max_position_embeddings": 16, "beta_fast": 2.0,
                                                         "beta_slow": 0.5, "truncate": False}})
yarn = LlamaForCausalLM(yc).eval()
yarn.load_state_dict(llama.state_dict())
yc.to_json_file(os.path.join(out, "llama_yarn_config.json"))
with torch.no_grad():
    lg = yarn(ids[:, :T]).logits
save_file({"input_ids": ids.clone(), "logits": lg.contiguous(), "loss": loss_of(lg, ids[:, 1:]).reshape([]),
           "adamw_loss": adamw_losses(LlamaForCausalLM, yc, yarn)},
          os.path.join(out, "llama_yarn_ref.safetensors"))

# Phi-4-mini's shape of Phi3ForCausalLM: RoPE on 12 of each head's 16 values (partial_rotary_factor 0.75) with
# LongRoPE (6 short and 6 long factors, original_max_position_embeddings 8 of 64: the attention factor sqrt(2)),
# a tied head; its own seed, after everything above. logits at T = 16 (past 8: the long factors), logits_short
# at T = 8 (the short ones)
torch.manual_seed(2468)
g = torch.Generator().manual_seed(97)
p4c = Phi3Config(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64, original_max_position_embeddings=8,
                 partial_rotary_factor=0.75, tie_word_embeddings=True, rms_norm_eps=1e-5, pad_token_id=None,
                 bos_token_id=1, eos_token_id=2,
                 rope_scaling={"rope_type": "longrope",
                               "short_factor": [round(1.0 + float(x), 4) for x in torch.rand(6, generator=g)],
                               "long_factor": [round(2.0 + 6.0 * float(x), 4) for x in torch.rand(6, generator=g)]})
phi4 = Phi3ForCausalLM(p4c).eval()
phi4.save_pretrained(os.path.join(out, "phi4"))
with torch.no_grad():
    lg = phi4(ids[:, :T]).logits
    lg_short = phi4(ids[:, :8]).logits
save_file({"input_ids": ids.clone(), "logits": lg.contiguous(), "logits_short": lg_short.contiguous(),
           "loss": loss_of(lg, ids[:, 1:]).reshape([]),
           "adamw_loss": adamw_losses(Phi3ForCausalLM, p4c, phi4),
           "eval": torch.tensor(windows_loss(phi4, toks), dtype=torch.float32).reshape([])},
          os.path.join(out, "phi4_ref.safetensors"))

# Granite (GraniteForCausalLM): the Llama block with its four multipliers away from 1 (embeddings x 6, residual
# outputs x 0.3, the attention's scale 0.2 in place of 1/sqrt(8), logits / 4), GQA 4 over 2, tied head; its own
# seed, after everything above
torch.manual_seed(1357)
grc = GraniteConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=True,
                    embedding_multiplier=6.0, residual_multiplier=0.3, attention_multiplier=0.2, logits_scaling=4.0,
                    bos_token_id=1, eos_token_id=2)
granite = GraniteForCausalLM(grc).eval()
granite.save_pretrained(os.path.join(out, "granite"))
with torch.no_grad():
    lg = granite(ids[:, :T]).logits
save_file({"input_ids": ids.clone(), "logits": lg.contiguous(), "loss": loss_of(lg, ids[:, 1:]).reshape([]),
           "adamw_loss": adamw_losses(GraniteForCausalLM, grc, granite),
           "eval": torch.tensor(windows_loss(granite, toks), dtype=torch.float32).reshape([])},
          os.path.join(out, "granite_ref.safetensors"))

# OLMo 2 (Olmo2ForCausalLM): the outputs of attention and MLP normalized before the residual add, q and k
# normalized over their whole projections; every norm's weight drawn away from 1 so that each shows; GQA 4 over 2,
# untied head, Olmo2Config's pad_token_id 1; its own seed, after everything above
torch.manual_seed(2024)
oc = Olmo2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, bos_token_id=None,
                 eos_token_id=2)
olmo2 = Olmo2ForCausalLM(oc).eval()
with torch.no_grad():
    for n, p in olmo2.named_parameters():
        if n.endswith("norm.weight"):
            p.uniform_(0.5, 1.5)
olmo2.save_pretrained(os.path.join(out, "olmo2"))
with torch.no_grad():
    lg = olmo2(ids[:, :T]).logits
save_file({"input_ids": ids.clone(), "logits": lg.contiguous(), "loss": loss_of(lg, ids[:, 1:]).reshape([]),
           "adamw_loss": adamw_losses(Olmo2ForCausalLM, oc, olmo2),
           "eval": torch.tensor(windows_loss(olmo2, toks), dtype=torch.float32).reshape([])},
          os.path.join(out, "olmo2_ref.safetensors"))
# Gemma 2 (Gemma2ForCausalLM): norms before and after attention and MLP, the attention's scale
# query_pre_attn_scalar^-1/2, soft caps on the scores and the logits (weights drawn with std 0.3 so that the
# scores and logits reach where tanh bends), sliding and full layers; the norm weights drawn away from 0 as
# Gemma 1's; its own seed, after everything above
torch.manual_seed(5150)
g2c = Gemma2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-6,
                   query_pre_attn_scalar=24, sliding_window=T, attn_logit_softcapping=5.0,
                   final_logit_softcapping=2.0, initializer_range=0.3, bos_token_id=1, eos_token_id=2)
gemma2 = Gemma2ForCausalLM(g2c).eval()
with torch.no_grad():
    for n, p in gemma2.named_parameters():
        if n.endswith("norm.weight"):
            p.uniform_(-0.5, 0.5)
gemma2.save_pretrained(os.path.join(out, "gemma2"))
with torch.no_grad():
    lg = gemma2(ids[:, :T]).logits
save_file({"input_ids": ids.clone(), "logits": lg.contiguous(), "loss": loss_of(lg, ids[:, 1:]).reshape([]),
           "adamw_loss": adamw_losses(Gemma2ForCausalLM, g2c, gemma2),
           "eval": torch.tensor(windows_loss(gemma2, toks), dtype=torch.float32).reshape([])},
          os.path.join(out, "gemma2_ref.safetensors"))
# Past the sliding window (16): 40 tokens through mistral's and gemma2's sliding layers (gemma2's middle layer
# full), the logits and loss, and mistral's 10 AdamW losses on them
ids40 = torch.randint(0, V, (2, 41), generator=torch.Generator().manual_seed(9))
wref = {"input_ids": ids40.clone()}
for name, m, cls, cfg in (("mistral", mistral, MistralForCausalLM, mc), ("gemma2", gemma2, Gemma2ForCausalLM, g2c)):
    with torch.no_grad():
        lg = m(ids40[:, :40]).logits
    wref[name + "_logits"] = lg.contiguous()
    wref[name + "_loss"] = loss_of(lg, ids40[:, 1:]).reshape([])
wref["mistral_adamw_loss"] = adamw_losses(MistralForCausalLM, mc, mistral, ids40)
save_file(wref, os.path.join(out, "window_ref.safetensors"))
# Gemma 3 (Gemma3ForCausalLM): Gemma 2's block with Gemma's norm on each head of q and k, the sliding layers'
# RoPE base (rope_local_base_freq) apart from the full layers' (rope_theta with rope_scaling), no soft caps;
# every norm weight drawn away from 0; its own seed, after everything above
torch.manual_seed(6160)
g3c = Gemma3TextConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-6,
                       query_pre_attn_scalar=24, sliding_window=8, sliding_window_pattern=3, rope_theta=10000.0,
                       rope_local_base_freq=100.0, rope_scaling={"rope_type": "linear", "factor": 4.0},
                       initializer_range=0.1, bos_token_id=1, eos_token_id=2)
gemma3 = Gemma3ForCausalLM(g3c).eval()
with torch.no_grad():
    for n, p in gemma3.named_parameters():
        if n.endswith("norm.weight"):
            p.uniform_(-0.5, 0.5)
gemma3.save_pretrained(os.path.join(out, "gemma3"))
with torch.no_grad():
    lg = gemma3(ids[:, :T]).logits
save_file({"input_ids": ids.clone(), "logits": lg.contiguous(), "loss": loss_of(lg, ids[:, 1:]).reshape([]),
           "adamw_loss": adamw_losses(Gemma3ForCausalLM, g3c, gemma3),
           "eval": torch.tensor(windows_loss(gemma3, toks), dtype=torch.float32).reshape([])},
          os.path.join(out, "gemma3_ref.safetensors"))
# Gemma 3's image-text model around gemma3's weights (no draws from the global stream after it)
vc = SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=16,
                        patch_size=4)
g3m = Gemma3ForConditionalGeneration(Gemma3Config(text_config=g3c.to_dict(), vision_config=vc.to_dict(),
                                                  mm_tokens_per_image=4, boi_token_index=120, eoi_token_index=121,
                                                  image_token_index=122)).eval()
g3m.model.language_model.load_state_dict({k[len("model."):]: v for k, v in gemma3.state_dict().items()
                                          if k.startswith("model.")})
g3m.save_pretrained(os.path.join(out, "gemma3_mm"))
with torch.no_grad():
    assert torch.equal(g3m(input_ids=ids[:, :T]).logits, gemma3(ids[:, :T]).logits)
# SmolLM3 (SmolLM3ForCausalLM): the Llama block, its NoPE layer without RoPE; attention biases drawn away from 0
# so that they show; its own seed, after everything above
torch.manual_seed(3003)
sc = SmolLM3Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=64, no_rope_layers=[1, 0, 1], attention_bias=True,
                   initializer_range=0.2,
                   pad_token_id=None, bos_token_id=1, eos_token_id=2)
assert sc.rope_parameters["rope_theta"] == 2e6
smollm3 = SmolLM3ForCausalLM(sc).eval()
with torch.no_grad():
    for n, p in smollm3.named_parameters():
        if n.endswith("proj.bias"):
            p.uniform_(-0.2, 0.2)
smollm3.save_pretrained(os.path.join(out, "smollm3"))
cj = os.path.join(out, "smollm3", "config.json")  # the default rope_theta left to SmolLM3Config, as the Hub's has it
cfg = json.load(open(cj))
cfg.pop("rope_parameters", None)
cfg.pop("rope_theta", None)
json.dump(cfg, open(cj, "w"), indent=2, sort_keys=True)
with torch.no_grad():
    lg = smollm3(ids[:, :T]).logits
save_file({"input_ids": ids.clone(), "logits": lg.contiguous(), "loss": loss_of(lg, ids[:, 1:]).reshape([]),
           "adamw_loss": adamw_losses(SmolLM3ForCausalLM, sc, smollm3),
           "eval": torch.tensor(windows_loss(smollm3, toks), dtype=torch.float32).reshape([])},
          os.path.join(out, "smollm3_ref.safetensors"))
# OLMo 3 (Olmo3ForCausalLM): OLMo 2's block with sliding layers, each kind of layer its RoPE (the full one's scaled);
# every norm's weight drawn away from 1; its own seed, after everything above
torch.manual_seed(3113)
o3c = Olmo3Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, sliding_window=8, initializer_range=0.1,
                  rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}},
                  bos_token_id=None, eos_token_id=2)
assert o3c.layer_types == ["sliding_attention"] * 3 + ["full_attention"]
olmo3 = Olmo3ForCausalLM(o3c).eval()
with torch.no_grad():
    for n, p in olmo3.named_parameters():
        if n.endswith("norm.weight"):
            p.uniform_(0.5, 1.5)
olmo3.save_pretrained(os.path.join(out, "olmo3"))
with torch.no_grad():
    lg = olmo3(ids[:, :T]).logits
save_file({"input_ids": ids.clone(), "logits": lg.contiguous(), "loss": loss_of(lg, ids[:, 1:]).reshape([]),
           "adamw_loss": adamw_losses(Olmo3ForCausalLM, o3c, olmo3),
           "eval": torch.tensor(windows_loss(olmo3, toks), dtype=torch.float32).reshape([])},
          os.path.join(out, "olmo3_ref.safetensors"))
# Ministral (MinistralForCausalLM): Mistral's block, each layer sliding or full by layer_types; its own seed, after
# everything above
torch.manual_seed(4114)
mnc = MinistralConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=8,
                      initializer_range=0.1, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                      bos_token_id=1, eos_token_id=2)  # (head_dim given: MinistralConfig leaves it None)
ministral = MinistralForCausalLM(mnc).eval()
ministral.save_pretrained(os.path.join(out, "ministral"))
with torch.no_grad():
    lg = ministral(ids[:, :T]).logits
save_file({"input_ids": ids.clone(), "logits": lg.contiguous(), "loss": loss_of(lg, ids[:, 1:]).reshape([]),
           "adamw_loss": adamw_losses(MinistralForCausalLM, mnc, ministral),
           "eval": torch.tensor(windows_loss(ministral, toks), dtype=torch.float32).reshape([])},
          os.path.join(out, "ministral_ref.safetensors"))
# The mixtures of experts (MixtralForCausalLM, Qwen3MoeForCausalLM): each its own seed, after everything above;
# transformers 5 fuses the experts in memory and saves them one by one (experts.N.w1 / gate_proj, ...). The seeds
# keep the AdamW steps well conditioned: the weights times 1 + 1e-7 noise move PyTorch's own 10 losses by under 1e-6
# (with others, such as 5115 for Mixtral, a token's second and third expert trade places within float noise by the
# fifth step, and the losses part by 5e-5)
moe = [("mixtral", 5117, MixtralForCausalLM,
        MixtralConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=64, num_local_experts=4,
                      num_experts_per_tok=2, initializer_range=0.1, bos_token_id=1, eos_token_id=2)),
       ("qwen3_moe", 5116, Qwen3MoeForCausalLM,
        Qwen3MoeConfig(vocab_size=V, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                       num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                       max_position_embeddings=64, num_experts=8, num_experts_per_tok=3, norm_topk_prob=False,
                       mlp_only_layers=[1], initializer_range=0.1, tie_word_embeddings=True, bos_token_id=1,
                       eos_token_id=2)),
       ("qwen2_moe", 5118, Qwen2MoeForCausalLM,
        Qwen2MoeConfig(vocab_size=V, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                       shared_expert_intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=64, num_experts=6, num_experts_per_tok=2,
                       norm_topk_prob=True, decoder_sparse_step=2, initializer_range=0.1, bos_token_id=1,
                       eos_token_id=2)),
       ("olmoe", 5119, OlmoeForCausalLM,
        OlmoeConfig(vocab_size=V, hidden_size=32, intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=64, num_experts=5, num_experts_per_tok=2,
                    initializer_range=0.1, pad_token_id=None, bos_token_id=1, eos_token_id=2))]
for name, seed, cls, cfg in moe:
    torch.manual_seed(seed)
    m = cls(cfg).eval()
    m.save_pretrained(os.path.join(out, name))
    with torch.no_grad():
        lg = m(ids[:, :T]).logits
    save_file({"input_ids": ids.clone(), "logits": lg.contiguous(), "loss": loss_of(lg, ids[:, 1:]).reshape([]),
               "adamw_loss": adamw_losses(cls, cfg, m),
               "eval": torch.tensor(windows_loss(m, toks), dtype=torch.float32).reshape([])},
              os.path.join(out, name + "_ref.safetensors"))
print("wrote", out)
