"""Peer timing for `dtrain bench step --model llama-100m --batch 4 --seq 64`:
transformers' LlamaForCausalLM at dtrain's llama-100m configuration (V 32000,
C 768, I 2048, 12 layers, 12 query heads sharing 4 key/value heads of 64,
tied embeddings, RMSNorm eps 1e-5, rope theta 10000), AdamW (fused when this
PyTorch has the fused CPU kernel), one process. With --hf-dir DIR: the model
of the Hugging Face directory DIR (AutoModelForCausalLM.from_pretrained, as
`dtrain bench step --model hf:DIR` reads it).
Usage: "$PEER_PYTHON" bench/torch_llama_step.py [--threads 2] [--steps 5] [--bf16] [--compile] [--hf-dir DIR]
(--bf16: torch.autocast("cpu", dtype=torch.bfloat16) around the forward, f32
weights and AdamW; --compile: torch.compile of the model, its compilation in
the warm-up steps). The loss is the cross-entropy of the logits against
separate targets, as dtrain's; SDPA attention (transformers' default)."""
import peer_huge_pages  # noqa: F401  (before torch: the peer on transparent huge pages)
import argparse, resource, time, torch, torch.nn.functional as F
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, default=2); p.add_argument("--steps", type=int, default=5)
p.add_argument("--warmup", type=int, default=2); p.add_argument("--batch", type=int, default=4)
p.add_argument("--seq", type=int, default=64); p.add_argument("--bf16", action="store_true")
p.add_argument("--compile", action="store_true"); p.add_argument("--hf-dir")
a = p.parse_args()
torch.set_num_threads(a.threads); torch.manual_seed(0)
if a.hf_dir:
    m = AutoModelForCausalLM.from_pretrained(a.hf_dir, dtype=torch.float32, use_cache=False)
    V = m.config.vocab_size
else:
    V = 32000
    cfg = LlamaConfig(vocab_size=V, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                      num_attention_heads=12, num_key_value_heads=4, head_dim=64, max_position_embeddings=1024,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True, use_cache=False)
    m = LlamaForCausalLM(cfg)
m.train()
try:
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True); fused = True
except (RuntimeError, TypeError):
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4); fused = False
fwd = torch.compile(m) if a.compile else m
idx = torch.randint(0, V, (a.batch, a.seq)); tgt = torch.randint(0, V, (a.batch, a.seq))
times, cpus = [], []
for i in range(a.warmup + a.steps):
    t0, c0 = time.perf_counter(), time.process_time()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
        logits = fwd(input_ids=idx).logits
    loss = F.cross_entropy(logits.view(-1, V).float(), tgt.view(-1))
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    if i >= a.warmup: times.append(time.perf_counter() - t0); cpus.append(time.process_time() - c0)
times.sort(); cpus.sort()
# cpu_ms: process CPU time (all threads) per step, the steadier measure on a loaded machine
print(f"torch {torch.__version__} threads {a.threads} bf16 {a.bf16} compile {a.compile} fused_adamw {fused} "
      f"params {sum(q.numel() for q in m.parameters())} median_ms {1000 * times[len(times) // 2]:.1f} "
      f"min_ms {1000 * times[0]:.1f} cpu_ms {1000 * cpus[len(cpus) // 2]:.1f} loss {loss.item():.4f} "
      f"peak_rss_mib {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}")  # ru_maxrss: KiB on Linux
