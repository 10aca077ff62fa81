#!/usr/bin/python3
"""PyTorch's side of `dtrain bench ddp`: the ConvNet under DDP (gloo), N
ranks of one thread, a fixed synthetic batch per rank, SGD lr 0.01 momentum
0.9; median ms per step of the slowest rank. With --world 1 it times the plain
single-process step (no DDP) for the overhead figure.

Run (Debian's PyTorch 1.13, reference only, never a build dependency):
    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/torch_ddp.py --world 2
Options: --batch 100 --steps 30 --warmup 3 --json
"""
import argparse, json, os, statistics, time
import torch, torch.nn as nn, torch.distributed as dist, torch.multiprocessing as mp
from torch_ref import ConvNet


def worker(rank, world, args, q):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = ConvNet()
    if world > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(args.port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(rank)
    x = torch.rand(args.batch, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)
    lossf = nn.CrossEntropyLoss()
    times = []
    for i in range(args.warmup + args.steps):
        t = time.perf_counter()
        opt.zero_grad()
        lossf(model(x), y).backward()
        opt.step()
        if i >= args.warmup:
            times.append(time.perf_counter() - t)
    med = statistics.median(times)
    if world > 1:
        tm = torch.tensor([med])
        dist.all_reduce(tm, op=dist.ReduceOp.MAX)
        med = tm.item()
        dist.destroy_process_group()
    if rank == 0:
        q.put(med)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--port", type=int, default=29533)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, a.world, a, q)) for r in range(a.world)]
    for p in procs:
        p.start()
    med = q.get()
    for p in procs:
        p.join()
    if a.json:
        print(json.dumps({"bench": "torch_ddp", "world": a.world, "batch": a.batch, "step_ms": 1e3 * med}))
    else:
        kind = "DDP gloo, %d ranks of 1 thread" % a.world if a.world > 1 else "1 process, 1 thread"
        print("torch %s, %s: ConvNet batch %d per rank: %.2f ms/step (median of %d, slowest rank)"
              % (torch.__version__, kind, a.batch, 1e3 * med, a.steps))


if __name__ == "__main__":
    main()
