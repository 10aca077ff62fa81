"""Peer of bench/pipe_bubble.c in torch.distributed.pipelining (CPU, gloo).

The same model (L blocks of Linear(D, D) + ReLU, loss = mean of the output)
cut into equal stages, the same batch and micro-batches (defaults as
pipe_bubble.c: 8 blocks of Linear(1024, 1024), batch 128 as m = 8), one
thread per rank, rank r pinned to CPU r (--pin 0: not); per schedule each
rank's fastest step of K, and its bubble measured as pipe_bubble.c's
idle/busy: busy = the same rank's stage(s) run forward + backward on the m
micro-batches with no communication (fastest of K), bubble = step / busy - 1.

    "$PEER_PYTHON" bench/torch_pipeline.py --ranks 2 --steps 5

Schedules: GPipe, 1F1B, Interleaved1F1B (2 stages per rank) and
InterleavedZeroBubble (2 stages per rank; torch has no single-chunk ZB-H1).
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                          ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble)


def blocks(n, d):
    layers = []
    for _ in range(n):
        layers += [nn.Linear(d, d), nn.ReLU()]
    return nn.Sequential(*layers)


def loss_fn(out, target):
    return out.mean()


def busy_time(stages, a, mb_x):
    """Seconds of this rank's compute alone: forward + backward of its
    stages on m micro-batches (the last stage from its loss)."""
    best = None
    for _ in range(a.steps):
        t0 = time.perf_counter()
        for _ in range(a.m):
            for st in stages:
                inp = mb_x.clone().requires_grad_(True)
                out = st.submod(inp)
                out.mean().backward()
        t = time.perf_counter() - t0
        best = t if best is None else min(best, t)
    return best


def worker(rank, a):
    if a.pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {rank % os.cpu_count()})
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port))
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(a.batch, a.dim)
    y = torch.zeros(a.batch, a.dim)
    for name, cls, v in [("gpipe", ScheduleGPipe, 1), ("1f1b", Schedule1F1B, 1),
                         ("interleaved", ScheduleInterleaved1F1B, 2), ("zb-interleaved", ScheduleInterleavedZeroBubble, 2)]:
        S = a.ranks * v
        if a.layers % S:
            continue
        per = a.layers // S
        stages = [PipelineStage(blocks(per, a.dim), c * a.ranks + rank, S, torch.device("cpu"))
                  for c in range(v)]
        sched = cls(stages[0] if v == 1 else stages, n_microbatches=a.m, loss_fn=loss_fn)
        times = []
        for _ in range(a.steps):
            dist.barrier()
            t0 = time.perf_counter()
            first = rank == 0
            last = (S - 1) % a.ranks == rank
            if first and last:
                sched.step(x, target=y)
            elif first:
                sched.step(x)
            elif last:
                sched.step(target=y)
            else:
                sched.step()
            times.append(time.perf_counter() - t0)
        busy = busy_time(stages, a, torch.randn(a.batch // a.m, a.dim))
        t = torch.tensor([min(times), busy])
        allt = [torch.zeros(2) for _ in range(a.ranks)]
        dist.all_gather(allt, t)
        if rank == 0:
            print(f"{name:15s} step {max(float(v[0]) for v in allt):.4f} s; per rank: "
                  + ", ".join(f"rank {q}: step {float(v[0]):.4f} s, busy {float(v[1]):.4f} s, "
                              f"bubble {float(v[0]) / float(v[1]) - 1:.3f}" for q, v in enumerate(allt))
                  + f" (formula {(a.ranks - 1) / (v * a.m * (3 if 'zb' in name else 1)):.3f})", flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("-m", type=int, default=8)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--pin", type=int, default=1)
    p.add_argument("--port", type=int, default=29517)
    a = p.parse_args()
    print(f"torch {torch.__version__}: p {a.ranks}, {a.layers} blocks of Linear({a.dim}, {a.dim})+ReLU, "
          f"batch {a.batch} as m {a.m}")
    mp.spawn(worker, args=(a,), nprocs=a.ranks, join=True)


if __name__ == "__main__":
    main()
