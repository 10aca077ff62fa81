"""Peer timing for `dtrain bench step --model gpt2` (default B=4, T=64):
GPT-2 124M (nanoGPT layout, tanh GELU, tied head), AdamW, one process.
Usage: python bench/torch_gpt2_step.py [--threads 2] [--steps 5] [--warmup 1]
           [--batch 4] [--seq 64] [--bf16] [--compile] [--fused-adamw] [--json] [--model gpt2|gpt2-medium]
--model: GPT-2 124M (12 layers, 768 wide, 12 heads; the default) or GPT-2 medium (350M: 24, 1024, 16).
--bf16: torch.autocast("cpu", dtype=torch.bfloat16) around the forward, f32 weights and AdamW.
--compile: torch.compile(model) (PyTorch >= 2.0; give --warmup >= 2: the first steps compile).
--fused-adamw: torch.optim.AdamW(fused=True) (PyTorch >= 2.4 on the CPU); without it, the
  default (foreach) AdamW. The strongest recipe: --bf16 --compile --fused-adamw.
Attention: scaled_dot_product_attention where PyTorch has it (>= 2.0), else written out (1.13).
--json: one JSON line instead of the text line (median_ms, min_ms, cpu_ms, first_ms, peak_rss_mib, ...)."""
import peer_huge_pages  # noqa: F401  (before torch: the peer on transparent huge pages)
import argparse, json, math, resource, time, torch, torch.nn as nn, torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, default=2); p.add_argument("--steps", type=int, default=5)
p.add_argument("--warmup", type=int, default=1); p.add_argument("--batch", type=int, default=4)
p.add_argument("--seq", type=int, default=64); p.add_argument("--bf16", action="store_true")
p.add_argument("--compile", action="store_true"); p.add_argument("--fused-adamw", action="store_true")
p.add_argument("--json", action="store_true")
p.add_argument("--model", choices=("gpt2", "gpt2-medium"), default="gpt2")
a = p.parse_args()
torch.set_num_threads(a.threads); torch.manual_seed(0)
L, H, C = (12, 12, 768) if a.model == "gpt2" else (24, 16, 1024)
V, TMAX = 50257, 1024
SDPA = hasattr(F, "scaled_dot_product_attention")
if a.compile and not hasattr(torch, "compile"):
    raise SystemExit("torch_gpt2_step.py: --compile needs PyTorch >= 2.0")

class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.ln_1, s.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        s.c_attn, s.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        s.c_fc, s.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
    def forward(s, x):
        B, T, _ = x.shape
        q, k, v = s.c_attn(s.ln_1(x)).split(C, dim=2)
        q, k, v = [t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v)]
        if SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
            att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        x = x + s.c_proj(y.transpose(1, 2).reshape(B, T, C))
        # F.gelu's tanh form exists since PyTorch 1.12 (the 1.13 peer has it): c_fc runs once
        return x + s.mlp_proj(F.gelu(s.c_fc(s.ln_2(x)), approximate="tanh"))

class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(V, C), nn.Embedding(TMAX, C)
        s.h = nn.ModuleList(Block() for _ in range(L)); s.ln_f = nn.LayerNorm(C)
    def forward(s, idx, tgt):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1]))
        for b in s.h: x = b(x)
        logits = s.ln_f(x) @ s.wte.weight.t()
        return F.cross_entropy(logits.view(-1, V).float(), tgt.view(-1))

m = GPT()
for mod in m.modules():
    if isinstance(mod, (nn.Linear, nn.Embedding)): nn.init.normal_(mod.weight, std=0.02)
opt = torch.optim.AdamW(m.parameters(), lr=1e-4, **({"fused": True} if a.fused_adamw else {}))
fwd = torch.compile(m) if a.compile else m
idx = torch.randint(0, V, (a.batch, a.seq)); tgt = torch.randint(0, V, (a.batch, a.seq))
times, cpus, first = [], [], None
for i in range(a.warmup + a.steps):
    t0, c0 = time.perf_counter(), time.process_time()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
        loss = fwd(idx, tgt)
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    dt = time.perf_counter() - t0
    if first is None: first = dt
    if i >= a.warmup: times.append(dt); cpus.append(time.process_time() - c0)
times.sort(); cpus.sort()
r = {"torch": torch.__version__, "threads": a.threads, "batch": a.batch, "seq": a.seq,
     "bf16": a.bf16, "compile": a.compile, "fused_adamw": a.fused_adamw, "sdpa": SDPA,
     "warmup": a.warmup, "steps": a.steps, "median_ms": round(1000 * times[len(times) // 2], 1),
     "min_ms": round(1000 * times[0], 1), "cpu_ms": round(1000 * cpus[len(cpus) // 2], 1),
     "first_ms": round(1000 * first, 1), "loss": round(loss.item(), 4),
     "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}  # ru_maxrss: KiB on Linux
if a.json:
    print(json.dumps(r))
else:
    # cpu_ms: process CPU time (all threads) per step, the steadier measure on a loaded machine
    print(f"torch {r['torch']} threads {a.threads} bf16 {a.bf16} compile {a.compile} "
          f"fused_adamw {a.fused_adamw} median_ms {r['median_ms']:.1f} min_ms {r['min_ms']:.1f} "
          f"cpu_ms {r['cpu_ms']:.1f} first_ms {r['first_ms']:.1f} loss {r['loss']:.4f} peak_rss_mib {r['peak_rss_mib']:.0f}")
