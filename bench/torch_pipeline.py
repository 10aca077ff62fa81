"""Peer of bench/pipe_bubble.c in torch.distributed.pipelining (CPU, gloo).

The same model (L blocks of Linear(D, D) + ReLU, loss = mean of the output)
cut into equal stages, the same batch and micro-batches; per schedule the
seconds per step on each rank (the slowest rank's is the step time).

    /work/venv/bin/python bench/torch_pipeline.py --ranks 2 --layers 4 --dim 128 --batch 32 -m 4 --steps 3

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


def worker(rank, a):
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
        t = torch.tensor([min(times)])
        allt = [torch.zeros(1) for _ in range(a.ranks)]
        dist.all_gather(allt, t)
        if rank == 0:
            print(f"{name:15s} step {max(float(v) for v in allt):.4f} s (per rank: "
                  + ", ".join(f"{float(v):.4f}" for v in allt) + ")", flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("-m", type=int, default=8)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--port", type=int, default=29517)
    a = p.parse_args()
    print(f"torch {torch.__version__}: p {a.ranks}, {a.layers} blocks of Linear({a.dim}, {a.dim})+ReLU, "
          f"batch {a.batch} as m {a.m}")
    mp.spawn(worker, args=(a,), nprocs=a.ranks, join=True)


if __name__ == "__main__":
    main()
