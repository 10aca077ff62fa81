#!/usr/bin/python3
"""Parity of dtrain's GPT with a PyTorch twin on the King James Bible.

Issue 15's parity benchmark: a small GPT-2 trained on the Bible token files
(make demo-gpt-data) from the same initial weights and the same batches, by
`dtrain train` and by a PyTorch twin (this script), in f32:
  - the first 10 steps' training losses: relative difference (target 1e-5);
  - the validation loss every --eval-every steps: the largest difference
    between dtrain and PyTorch (2 threads), beside PyTorch's own run-to-run
    noise, measured as PyTorch with 1 thread against PyTorch with 2 threads.

How "the same" is made:
  - weights: this script draws them (torch.manual_seed(seed), GPT-2's init:
    normal 0.02, residual projections 0.02 / sqrt(2 n_layer), zero biases,
    LayerNorm 1/0, drawn in the order of transformers' GPT2LMHeadModel, so
    they are also what `dtrain train --rng torch --seed N` draws), writes
    them as safetensors with Hugging Face's names and dtrain loads them with
    --init-from;
  - batches: llm.c token windows (item i = tokens[i T, i T + T + 1)), drawn
    by torch.randperm(items, generator seeded seed + epoch) in batches of B
    (DistributedSampler's order at world size 1, which dtrain's --rng torch
    reproduces);
  - optimizer: AdamW (lr, betas 0.9/0.999, eps 1e-8, weight decay on every
    parameter), constant learning rate, no clipping, no dropout.
  - validation: the first --limit-test windows of the validation file, the
    mean loss over their tokens.

Run with Debian's PyTorch 1.13 (never by the build or the tests):
    /usr/bin/python3 bench/gpt_bible_parity.py --cli build/dtrain --data build/gpt-data
It prints a table and a JSON line with the figures.
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def read_tokens(path):
    with open(path, "rb") as f:
        head = np.frombuffer(f.read(1024), dtype="<i4")
        if head[0] != 20240520:
            sys.exit(f"{path}: not an llm.c token file (magic {head[0]})")
        n = int(head[2])
        return np.frombuffer(f.read(2 * n), dtype="<u2").astype(np.int64)


def write_safetensors(path, tensors):
    """safetensors: u64 header size, JSON header, data."""
    header, blobs, off = {}, [], 0
    for name, t in tensors:
        b = t.detach().contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


class Conv1D(nn.Module):
    def __init__(self, nx, nf):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)  # transformers' Conv1D draws in its constructor

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).reshape(*x.shape[:-1], -1)


class Block(nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.h = h
        self.ln_1, self.ln_2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.attn = nn.Module()
        self.attn.c_attn, self.attn.c_proj = Conv1D(c, 3 * c), Conv1D(c, c)
        self.mlp = nn.Module()
        self.mlp.c_fc, self.mlp.c_proj = Conv1D(c, 4 * c), Conv1D(4 * c, c)

    def attention(self, x):
        b, t, c = x.shape
        q, k, v = self.attn.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v))
        w = q @ k.transpose(-1, -2) / math.sqrt(c // self.h)
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        w = w.masked_fill(~mask, float("-inf")).softmax(-1)
        return self.attn.c_proj((w @ v).transpose(1, 2).reshape(b, t, c))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, heads, width, positions, vocab):
        super().__init__()
        self.transformer = nn.Module()
        self.transformer.wte = nn.Embedding(vocab, width)
        self.transformer.wpe = nn.Embedding(positions, width)
        self.transformer.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.transformer.ln_f = nn.LayerNorm(width)

    def init_gpt2(self, layers):
        """GPT-2's init in transformers' order (GPT2PreTrainedModel._init_weights applied post-order after
        the constructors' draws: wte, wpe, then per block c_attn, attn.c_proj at 0.02 and again at
        0.02 / sqrt(2 layers), the MLP alike); LayerNorm 1/0 and zero biases stay from the constructors."""
        tr = self.transformer
        nn.init.normal_(tr.wte.weight, 0.0, 0.02)
        nn.init.normal_(tr.wpe.weight, 0.0, 0.02)
        for blk in tr.h:
            for part in (blk.attn, blk.mlp):
                for conv in part.children():
                    nn.init.normal_(conv.weight, 0.0, 0.02)
                    nn.init.zeros_(conv.bias)
                nn.init.normal_(part.c_proj.weight, 0.0, 0.02 / math.sqrt(2 * layers))

    def logits(self, idx):
        tr = self.transformer
        x = tr.wte(idx) + tr.wpe(torch.arange(idx.shape[1]))
        for blk in tr.h:
            x = blk(x)
        return tr.ln_f(x) @ tr.wte.weight.t()

    def forward(self, idx, targets):
        logits = self.logits(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def loss_f32(self, idx, targets):
        """The loss in f32 from the logits in the model's dtype (a bf16 model's)."""
        logits = self.logits(idx).float()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def windows(tokens, idx, t):
    rows = np.stack([tokens[i * t: i * t + t + 1] for i in idx])
    return torch.from_numpy(rows[:, :-1]), torch.from_numpy(rows[:, 1:])


def torch_run(a, init_state, train, val, threads):
    torch.set_num_threads(threads)
    model = GPT(a.n_layer, a.n_head, a.n_embd, a.seq, a.vocab)
    model.load_state_dict(init_state)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=a.weight_decay)
    items = (len(train) - a.seq - 1) // a.seq + 1
    g = torch.Generator()
    g.manual_seed(a.seed + 0)  # epoch 0
    perm = torch.randperm(items, generator=g).tolist()
    losses, vals = [], []
    nval = a.limit_test

    def evaluate():
        model.eval()
        with torch.no_grad():
            tot = 0.0
            for s in range(0, nval, a.batch):
                x, y = windows(val, range(s, min(nval, s + a.batch)), a.seq)
                tot += model(x, y).item() * x.shape[0]
        model.train()
        return tot / nval

    t0 = time.time()
    for step in range(1, a.steps + 1):
        x, y = windows(train, perm[(step - 1) * a.batch: step * a.batch], a.seq)
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % a.eval_every == 0:
            vals.append((step, evaluate()))
    return losses, vals, time.time() - t0


def dtrain_run(a, init_file, work):
    metrics = os.path.join(work, "dtrain.jsonl")
    cmd = [a.cli, "train", "--model", "gpt-mini", "--n-layer", str(a.n_layer), "--n-head", str(a.n_head),
           "--n-embd", str(a.n_embd), "--block-size", str(a.seq), "--vocab-size", str(a.vocab), "--seq", str(a.seq),
           "--batch", str(a.batch), "--optimizer", "adamw", "--lr", str(a.lr), "--weight-decay", str(a.weight_decay),
           "--seed", str(a.seed), "--rng", "torch", "--max-steps", str(a.steps), "--threads", str(a.threads),
           "--data", "tokens:" + os.path.join(a.data, "train.bin"),
           "--val-data", "tokens:" + os.path.join(a.data, "val.bin"), "--limit-test", str(a.limit_test),
           "--eval-every", str(a.eval_every), "--log-every", "1", "--progress", "none",
           "--init-from", init_file, "--metrics", metrics]
    t0 = time.time()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.time() - t0
    losses, vals = {}, {}
    with open(metrics) as f:
        for line in f:
            r = json.loads(line)
            if r["event"] == "step":
                losses[r["step"]] = r["loss"]
            elif r["event"] == "eval" and r["step"] % a.eval_every == 0:
                vals[r["step"]] = r["test_loss"]
    return [losses[s] for s in range(1, a.steps + 1)], sorted(vals.items()), wall


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cli", default="build/dtrain")
    p.add_argument("--data", default="build/gpt-data", help="make demo-gpt-data's directory")
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--limit-test", type=int, default=64)
    p.add_argument("--threads", type=int, default=2, help="threads of dtrain and of the reference PyTorch run")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.limit_test % a.batch:
        sys.exit("--limit-test must be a multiple of --batch (the validation mean is then the same either way)")
    train, val = read_tokens(os.path.join(a.data, "train.bin")), read_tokens(os.path.join(a.data, "val.bin"))
    a.vocab = int(open(os.path.join(a.data, "vocab_size")).read())
    torch.manual_seed(a.seed)
    model = GPT(a.n_layer, a.n_head, a.n_embd, a.seq, a.vocab)
    model.init_gpt2(a.n_layer)
    init_state = {k: v.clone() for k, v in model.state_dict().items()}
    with tempfile.TemporaryDirectory() as work:
        init_file = os.path.join(work, "init.safetensors")
        write_safetensors(init_file, list(model.named_parameters()))
        d_loss, d_val, d_wall = dtrain_run(a, init_file, work)
    t_loss, t_val, t_wall = torch_run(a, init_state, train, val, a.threads)
    other = 1 if a.threads != 1 else 2
    n_loss, n_val, n_wall = torch_run(a, init_state, train, val, other)

    rel10 = max(abs(d - t) / abs(t) for d, t in zip(d_loss[:10], t_loss[:10]))
    noise10 = max(abs(n - t) / abs(t) for n, t in zip(n_loss[:10], t_loss[:10]))
    print(f"GPT L={a.n_layer} H={a.n_head} C={a.n_embd} T={a.seq} B={a.batch} vocab={a.vocab}, AdamW lr {a.lr}, "
          f"{a.steps} steps, PyTorch {torch.__version__}")
    print(f"{'step':>5} {'dtrain':>10} {'torch x' + str(a.threads):>10} {'torch x' + str(other):>10}   (training loss)")
    for s in range(10):
        print(f"{s + 1:5d} {d_loss[s]:10.6f} {t_loss[s]:10.6f} {n_loss[s]:10.6f}")
    print(f"{'step':>5} {'dtrain':>10} {'torch x' + str(a.threads):>10} {'torch x' + str(other):>10}   (validation loss)")
    for (s, d), (_, t), (_, n) in zip(d_val, t_val, n_val):
        print(f"{s:5d} {d:10.6f} {t:10.6f} {n:10.6f}")
    dv = max(abs(d - t) for (_, d), (_, t) in zip(d_val, t_val))
    nv = max(abs(n - t) for (_, n), (_, t) in zip(n_val, t_val))
    print(f"first 10 steps: max relative difference dtrain vs torch {rel10:.2e} (target 1e-5); "
          f"torch {other} vs {a.threads} threads {noise10:.2e}")
    print(f"validation: max |dtrain - torch| {dv:.2e}; torch's own noise (|{other} - {a.threads} threads|) {nv:.2e}")
    print(f"wall: dtrain {d_wall:.1f} s (process, incl. start), torch {t_wall:.1f} s ({a.threads} threads), "
          f"{n_wall:.1f} s ({other})")
    print(json.dumps({"rel10": rel10, "noise10": noise10, "val_diff": dv, "val_noise": nv,
                      "final_val": {"dtrain": d_val[-1][1], "torch": t_val[-1][1]}}))


if __name__ == "__main__":
    main()
