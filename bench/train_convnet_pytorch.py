#!/usr/bin/python3
"""PyTorch reference for `dtrain train --model convnet --data fashion-mnist`:
the same model, data, hyperparameters and loop (one process), reporting the
same figures: epoch wall time (data loading included, evaluation excluded),
samples/s, train loss over the last 100 steps, test loss and accuracy.

    /usr/bin/python3 bench/train_convnet_pytorch.py --seed 0 --threads 2 [--limit-train N]

Data: the IDX files of Debian's dataset-fashion-mnist, read with gzip +
numpy and scaled like ToTensor (x / 255). The whole training set is one
tensor and batches are index_select'ed in a seeded random order, which is
the fastest single-process PyTorch configuration (no DataLoader workers).
"""
import argparse, time
import numpy as np
import torch
import torch.nn.functional as F
from torch_ref import ConvNet, fashion


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--limit-train", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    xtr, ytr = fashion("train")
    xte, yte = fashion("t10k")
    if a.limit_train:
        xtr, ytr = xtr[:a.limit_train], ytr[:a.limit_train]
    model = ConvNet()
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    g = torch.Generator().manual_seed(a.seed)
    perm = torch.randperm(len(xtr), generator=g)
    losses = []
    t0 = time.time()
    model.train()
    for s in range(0, len(xtr), a.batch):
        i = perm[s:s + a.batch]
        x, y = xtr.index_select(0, i), ytr.index_select(0, i)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    wall = time.time() - t0
    model.eval()
    with torch.no_grad():
        out = torch.cat([model(xte[s:s + 500]) for s in range(0, len(xte), 500)])
        tl = F.cross_entropy(out, yte).item()
        acc = (out.argmax(1) == yte).float().mean().item()
    print(f"test loss: {tl:.4f}")
    print(f"test accuracy: {100 * acc:.2f}% ({len(xte)} items)")
    print(f"train loss (last 100 steps): {np.mean(losses[-100:]):.4f}")
    print(f"epoch wall time: {wall:.2f} s")
    print(f"samples/s: {len(xtr) / wall:.0f}")

if __name__ == "__main__":
    main()
