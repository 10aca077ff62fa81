#!/usr/bin/python3
"""PyTorch's side of `dtrain bench step`: the same models, the same step
(zero_grad, forward, loss, backward, SGD lr 0.01), median ms per step.

Run (Debian's PyTorch 1.13, reference only, never a build dependency):
    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/torch_step.py --threads 2
Options: --model convnet,mlp  --steps 20  --warmup 3  --json
         --bf16: forward and loss under torch.autocast("cpu", dtype=torch.bfloat16)
         (f32 weights and SGD; conv2d/linear/matmul in bf16, PyTorch's CPU list),
         the peer of `dtrain bench step --precision bf16`
OPENBLAS_NUM_THREADS=1 is PyTorch's best case on this machine (the issue
measured 14.9 ms for the ConvNet at batch 100 with it, 18.5-18.9 ms without).
"""
import argparse, contextlib, json, statistics, time
import torch, torch.nn as nn
from torch_ref import ConvNet


class MLP(nn.Module):  # Paddle auto-parallel example: x @ w0 @ w1, loss = mean
    def __init__(self):
        super().__init__()
        self.w0 = nn.Parameter(torch.empty(1024, 4096)); nn.init.xavier_uniform_(self.w0)
        self.w1 = nn.Parameter(torch.empty(4096, 1024)); nn.init.xavier_uniform_(self.w1)
    def forward(self, x):
        return torch.matmul(torch.matmul(x, self.w0), self.w1)

def bench(name, batch, steps, warmup, bf16=False):
    torch.manual_seed(0)
    if name == "convnet":
        m, x, y = ConvNet(), torch.rand(batch, 1, 28, 28) * 2 - 1, torch.arange(batch) % 10
        loss_fn = lambda out: nn.functional.cross_entropy(out, y)
        flops = batch * (3 * (2*16*784*25 + 2*32*196*400 + 2*1568*10) - 2*16*784*25)
    else:
        m, x = MLP(), torch.rand(batch, 128, 1024) * 2 - 1
        loss_fn = lambda out: out.mean()
        flops = batch * 5 * 2 * 128 * 1024 * 4096
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    times = []
    cpu0 = 0.0
    for s in range(warmup + steps):
        if s == warmup:
            cpu0 = time.process_time()
        t0 = time.perf_counter()
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            loss = loss_fn(m(x))
        loss.backward()
        opt.step()
        t1 = time.perf_counter()
        if s >= warmup:
            times.append(t1 - t0)
    cpu_ms = (time.process_time() - cpu0) / steps * 1e3
    med = statistics.median(times)
    return {"bench": "torch_step", "model": name, "batch": batch, "threads": torch.get_num_threads(),
            "precision": "bf16-autocast" if bf16 else "fp32",
            "median_ms": round(med * 1e3, 3), "min_ms": round(min(times) * 1e3, 3), "cpu_ms": round(cpu_ms, 3),
            "samples_per_s": round(batch / med, 1), "gflops": round(flops / med * 1e-9, 1),
            "torch": torch.__version__}

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="convnet,mlp")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--bf16", action="store_true", help="forward under CPU bf16 autocast")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    for name in a.model.split(","):
        r = bench(name, 100 if name == "convnet" else 4, a.steps, a.warmup, a.bf16)
        print(json.dumps(r) if a.json else
              "%-8s %s batch %-4d threads %d: %8.2f ms/step (min %.2f; cpu %.2f)  %9.1f samples/s  %6.1f GFLOP/s  [torch %s]" %
              (name, r["precision"], r["batch"], r["threads"], r["median_ms"], r["min_ms"], r["cpu_ms"], r["samples_per_s"], r["gflops"], r["torch"]))
