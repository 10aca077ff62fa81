#!/usr/bin/python3
"""PyTorch reference for the two-rank `dtrain run -n 2 -- dtrain train ...`:
the ConvNet on Fashion-MNIST under DistributedDataParallel (gloo), W ranks
of one thread each, batch B per rank, SGD lr 0.01 momentum 0.9, one epoch,
DistributedSampler(seed=SEED) with set_epoch, every rank reading the IDX
files itself. Reports what dtrain train reports: the epoch wall time of the
slowest rank (batches assembled from the in-memory training set inside it,
as dtrain's loader does; reading the files and evaluation outside), samples/s, the
train loss over the last 100 steps and the test loss and accuracy (rank 0,
whole test set, its own model in eval mode).

    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/train_convnet_ddp_pytorch.py --seed 0
Options: --world 2 --batch 100 --lr 0.01 --momentum 0.9 --eval-every N
         (also evaluate every N steps and print "eval STEP ACC"; not timed)
"""
import argparse, os, time
import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data.distributed import DistributedSampler
from torch_ref import ConvNet, fashion


def evaluate(model, xte, yte):
    model.eval()
    with torch.no_grad():
        out = torch.cat([model(xte[s:s + 500]) for s in range(0, len(xte), 500)])
    model.train()
    return F.cross_entropy(out, yte).item(), (out.argmax(1) == yte).float().mean().item()


def worker(rank, a, q):
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(a.port))
    dist.init_process_group("gloo", rank=rank, world_size=a.world)
    torch.manual_seed(a.seed)
    model = nn.parallel.DistributedDataParallel(ConvNet())
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    xtr, ytr = fashion("train")
    dist.barrier()
    t0 = time.time()  # as dtrain's epoch time: the files are read before it starts
    sampler = DistributedSampler(range(len(xtr)), num_replicas=a.world, rank=rank, shuffle=True, seed=a.seed)
    sampler.set_epoch(0)
    order = torch.tensor(list(iter(sampler)))
    losses, evals, t_eval = [], [], 0.0
    step = 0
    for s in range(0, len(order), a.batch):
        i = order[s:s + a.batch]
        x, y = xtr.index_select(0, i), ytr.index_select(0, i)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        step += 1
        if a.eval_every and step % a.eval_every == 0:
            te = time.time()
            if rank == 0:
                if not hasattr(a, "xte"):
                    a.xte, a.yte = fashion("t10k")
                evals.append((step, evaluate(model.module, a.xte, a.yte)[1]))
            dist.barrier()
            t_eval += time.time() - te
    wall = torch.tensor([time.time() - t0 - t_eval])
    dist.all_reduce(wall, op=dist.ReduceOp.MAX)
    tl = torch.tensor([float(np.mean(losses[-100:]))])
    dist.all_reduce(tl)
    if rank == 0:
        xte, yte = fashion("t10k")
        test_loss, acc = evaluate(model.module, xte, yte)
        q.put((wall.item(), tl.item() / a.world, test_loss, acc, evals, len(xtr)))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--port", type=int, default=29541)
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, a, q)) for r in range(a.world)]
    for p in procs:
        p.start()
    wall, tl, test_loss, acc, evals, n = q.get()
    for p in procs:
        p.join()
    for s, e in evals:
        print(f"eval {s} {100 * e:.2f}")
    print(f"torch {torch.__version__}, DDP gloo, {a.world} ranks of 1 thread, batch {a.batch} per rank, seed {a.seed}")
    print(f"test loss: {test_loss:.4f}")
    print(f"test accuracy: {100 * acc:.2f}% (10000 items)")
    print(f"train loss (last 100 steps): {tl:.4f}")
    print(f"epoch wall time: {wall:.2f} s (slowest rank; batch assembly included, file reading and evaluation excluded)")
    print(f"samples/s: {n / wall:.0f}")


if __name__ == "__main__":
    main()
