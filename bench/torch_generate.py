#!/usr/bin/env python3
"""The Hugging Face side of bench/generate_tps: greedy generation with
transformers' GPT-2 124M (GPT2Config's defaults) or, with --model
llama-100m, a LlamaForCausalLM of dtrain's llama-100m sizes (random
weights, seed 0: the speed does not depend on the values), its key/value
cache on, after a prompt of the same tokens generate_tps uses
((i * 7919) % vocab).

Run (the peer environment: torch and transformers from PyPI; reference
only, never a build dependency):
    "$PEER_PYTHON" bench/torch_generate.py --threads 2 --prompt 16 --new 64 --rounds 3
    "$PEER_PYTHON" bench/torch_generate.py --model llama-100m --threads 2 --prompt 16 --new 48 --rounds 3
Prints the median wall and process-CPU tokens/s over the rounds (each
round generates exactly --new tokens), as generate_tps prints dtrain's.
"""
import argparse, statistics, time

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM


def make(name):
    """The model generate_tps --model NAME times, and its vocabulary."""
    if name == "gpt2":
        cfg = GPT2Config()
        return GPT2LMHeadModel(cfg), cfg.vocab_size
    # models/llama_config.c's llama-100m
    cfg = LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                      num_attention_heads=12, num_key_value_heads=4, head_dim=64, max_position_embeddings=1024,
                      tie_word_embeddings=True, rms_norm_eps=1e-5)
    return LlamaForCausalLM(cfg), cfg.vocab_size


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("gpt2", "llama-100m"), default="gpt2")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--beams", type=int, default=1, help="num_beams (beam search, no stop token)")
    a = ap.parse_args()
    if a.prompt < 1 or a.new < 1 or a.rounds < 1:
        ap.error("--prompt, --new and --rounds must be at least 1")
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    m, vocab = make(a.model)
    m = m.eval()
    ids = torch.tensor([[(i * 7919) % vocab for i in range(a.prompt)]])
    wall, cpu = [], []
    with torch.no_grad():
        m.generate(ids, max_new_tokens=2, do_sample=False, use_cache=True, pad_token_id=0, num_beams=a.beams)  # warm-up
        for _ in range(a.rounds):
            w0, c0 = time.perf_counter(), time.process_time()
            out = m.generate(ids, max_new_tokens=a.new, min_new_tokens=a.new, do_sample=False, use_cache=True,
                             pad_token_id=0, num_beams=a.beams)
            w1, c1 = time.perf_counter(), time.process_time()
            assert out.shape[1] == a.prompt + a.new
            wall.append(a.new / (w1 - w0))
            cpu.append(a.new / (c1 - c0))
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {a.model} prompt {a.prompt} new {a.new} beams {a.beams} rounds {a.rounds}")
    print(f"kv cache  {statistics.median(wall):8.2f} tokens/s wall  {statistics.median(cpu):8.2f} tokens/CPU-s")


if __name__ == "__main__":
    main()
