#!/usr/bin/env python3
"""The peers of `dtrain bench zero` (issue 13): the seed's MLP
(x[B,128,1024] @ w0[1024,4096] @ w1[4096,1024], loss = mean, AdamW lr 1e-4)
on N ranks of one thread (gloo, CPU) under PyTorch DDP, FSDP2 `fully_shard`
with reshard_after_forward True and False, and DeepSpeed's ZeRO stages 1-3
where its CPU path runs (it says why when it does not). Blocks of 5 steps
cycle through the modes as dtrain's bench does; per mode: the median step
time of the slowest rank, the parameter/gradient/optimizer-state bytes this
rank holds after a step (DeepSpeed's gradient buffers are its own: n/a), and
rank 0's peak RSS over all modes.

Run (newest torch from PyPI in the venv; reference only, never a build or
test dependency):
    "$PEER_PYTHON" bench/torch_fsdp2.py --world 2 --steps 20
and beside it:
    dtrain run -n 2 -- dtrain bench zero --model mlp --steps 20
Options: --batch 4 --dim 1024 --hidden 4096 --seq 128 --modes ddp,fsdp2,fsdp2-keep,ds1,ds2,ds3 --json
"""
import argparse, json, os, resource, statistics, sys, time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


class MLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w0 = nn.Parameter(torch.empty(dim, hidden))
        self.w1 = nn.Parameter(torch.empty(hidden, dim))
        nn.init.xavier_uniform_(self.w0)
        nn.init.xavier_uniform_(self.w1)

    def forward(self, x):
        return (x @ self.w0 @ self.w1).mean()


def local_bytes(t):
    if hasattr(t, "ds_tensor"):  # a DeepSpeed ZeRO-3 parameter: this rank's partition
        t = t.ds_tensor
    loc = t.to_local() if hasattr(t, "to_local") else t
    return loc.numel() * loc.element_size()


def build(mode, args, world):
    torch.manual_seed(0)
    m = MLP(args.dim, args.hidden)
    if mode == "ddp":
        m = nn.parallel.DistributedDataParallel(m)
        return m, torch.optim.AdamW(m.parameters(), lr=1e-4), None
    if mode.startswith("fsdp2"):
        from torch.distributed.fsdp import fully_shard
        fully_shard(m, reshard_after_forward=(mode == "fsdp2"))
        return m, torch.optim.AdamW(m.parameters(), lr=1e-4), None
    if mode.startswith("ds"):
        import deepspeed  # noqa: F401  (the error says why it cannot run)
        cfg = {"train_micro_batch_size_per_gpu": args.batch, "gradient_accumulation_steps": 1,
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
               "zero_optimization": {"stage": int(mode[2])}}
        engine, opt, _, _ = deepspeed.initialize(model=m, model_parameters=m.parameters(), config=cfg)
        return engine, opt, engine
    raise SystemExit("unknown mode " + mode)


def state_bytes(model, opt, engine):
    p = sum(local_bytes(t) for t in model.parameters())
    # DeepSpeed keeps (partitioned) gradients in its own buffers, not in .grad: not counted (-1)
    g = -1 if engine is not None else sum(local_bytes(t.grad) for t in model.parameters() if t.grad is not None)
    o = 0
    for st in opt.state.values():
        for v in st.values():
            if torch.is_tensor(v) and v.numel() > 1:
                o += local_bytes(v)
    return p, g, o


def worker(rank, world, args, q):
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"] = str(rank), str(world), str(rank)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    g = torch.Generator().manual_seed(rank)
    x = torch.rand(args.batch, args.seq, args.dim, generator=g) * 2 - 1
    runs, skipped = [], {}
    for mode in args.modes.split(","):
        try:
            model, opt, engine = build(mode, args, world)
        except Exception as e:  # DeepSpeed without an accelerator, mostly
            skipped[mode] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "")
            continue
        runs.append({"mode": mode, "model": model, "opt": opt, "engine": engine, "t": [], "loss": None})

    def step(r):
        if r["engine"] is not None:
            loss = r["engine"](x)
            r["engine"].backward(loss)
            r["engine"].step()
        else:
            r["opt"].zero_grad(set_to_none=False)
            loss = r["model"](x)
            loss.backward()
            r["opt"].step()
        return loss.item()

    for r in runs:
        for _ in range(2):
            step(r)
    while any(len(r["t"]) < args.steps for r in runs):
        for r in runs:
            if len(r["t"]) >= args.steps:
                continue
            dist.barrier()
            for _ in range(5):
                if len(r["t"]) >= args.steps:
                    break
                t = time.perf_counter()
                r["loss"] = step(r)
                r["t"].append(time.perf_counter() - t)
    out = []
    for r in runs:
        med = torch.tensor([statistics.median(r["t"])])
        dist.all_reduce(med, op=dist.ReduceOp.MAX)
        p, gb, o = state_bytes(r["model"] if r["engine"] is None else r["engine"].module, r["opt"], r["engine"])
        out.append({"mode": r["mode"], "step_ms": 1e3 * med.item(), "param_bytes": p, "grad_bytes": gb,
                    "optim_bytes": o, "loss": r["loss"]})
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    dist.destroy_process_group()
    if rank == 0:
        q.put((out, skipped, rss))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--modes", default="ddp,fsdp2,fsdp2-keep,ds1,ds2,ds3")
    ap.add_argument("--port", type=int, default=29541)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, a.world, a, q)) for r in range(a.world)]
    for p in procs:
        p.start()
    out, skipped, rss = q.get()
    for p in procs:
        p.join()
    psi = 4.0 * 2 * a.dim * a.hidden
    base = out[0]["step_ms"] if out else 0
    if a.json:
        for o in out:
            print(json.dumps(dict(o, bench="torch_zero", torch=torch.__version__, world=a.world)))
        for k, v in skipped.items():
            print(json.dumps({"bench": "torch_zero", "mode": k, "skipped": v}))
        return
    print("torch %s, MLP %dx%d (Psi = %.2f MiB), batch %d x %d per rank, %d ranks (gloo), 1 thread each, AdamW;"
          % (torch.__version__, a.dim, a.hidden, psi / 2**20, a.batch, a.seq, a.world))
    print("medians of %d steps (slowest rank), blocks of 5 interleaved; rank 0's peak RSS %.1f MiB (all modes)"
          % (a.steps, rss / 2**20))
    print("%-11s %10s %8s %11s %11s %11s %12s" % ("mode", "step ms", "x first", "params MiB", "grads MiB",
                                                  "optim MiB", "last loss"))
    for o in out:
        grads = "%11.2f" % (o["grad_bytes"] / 2**20) if o["grad_bytes"] >= 0 else "%11s" % "n/a"
        print("%-11s %10.2f %8.3f %11.2f %s %11.2f %12.7g" % (
            o["mode"], o["step_ms"], o["step_ms"] / base, o["param_bytes"] / 2**20, grads,
            o["optim_bytes"] / 2**20, o["loss"]))
    for k, v in skipped.items():
        print("%-11s did not run: %s" % (k, v))


if __name__ == "__main__":
    sys.exit(main())
