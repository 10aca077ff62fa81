"""PyTorch's own bf16-vs-f32 gap on the curve bench/gpt_bf16_curve.sh measures.

The bf16 GPT loss curve of dtrain is checked against its f32 curve
(bench/gpt_bf16_curve.sh, tests/train/test_bf16_curve.c). Two training runs
in different arithmetic leave each other after some steps whatever the
library: this script measures by how much, for PyTorch and for dtrain, from
the same initial weights and the same batches:
  - dtrain --precision fp32 and --precision bf16 (`dtrain train`, --init-from
    the weights drawn here);
  - PyTorch f32, and PyTorch bf16 (torch.autocast("cpu", dtype=bfloat16)
    around the forward, f32 weights and AdamW: PyTorch's mixed-precision
    recipe);
  - PyTorch with bf16 weights (the module in bf16, every activation and
    gradient bf16, f32 master weights and AdamW: DeepSpeed's bf16 and FSDP's
    MixedPrecision(param_dtype=bfloat16) recipe, the one `dtrain train
    --precision bf16` follows; the loss from the bf16 logits in f32);
  - PyTorch f32 with another thread count: the same arithmetic summed in
    another order, the smallest perturbation there is.
For each pair it prints the largest per-step gap and its step, the steps
outside the per-step bound (2% of the f32 loss + 0.01), the first step
outside it, and the largest gap of the mean loss over windows of --window
steps (non-overlapping, from step 1; the curve a plot shows), then one JSON
line with the same figures.

Model and data as bench/gpt_bf16_curve.sh: gpt-micro (2 layers, 2 heads,
width 64, 64 positions, the token files' vocabulary), AdamW (betas 0.9/0.999,
eps 1e-8, weight decay 0.01, constant lr), B=8, T=64, llm.c token windows in
torch.randperm(items, seed + epoch) order (DistributedSampler's, which
dtrain's --rng torch reproduces). The weights: torch.manual_seed(seed),
GPT-2's init (bench/gpt_bible_parity.py's model), or --init-from FILE's (a
safetensors state_dict, e.g. `dtrain ckpt convert --full` of a checkpoint
saved by `dtrain train --max-steps 1 --lr 0 --weight-decay 0 --save DIR`:
dtrain's own initial weights for its --seed).

Never run by the build or the tests:
    $PEER_PYTHON bench/torch_gpt_bf16_curve.py --cli build/dtrain --data build/gpt-data [--steps 300]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_bible_parity import GPT, read_tokens, windows, write_safetensors  # noqa: E402


def torch_run(a, init_state, train, threads, bf16, bf16_weights=False):
    torch.set_num_threads(threads)
    model = GPT(2, 2, 64, 64, a.vocab)
    model.load_state_dict(init_state)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    work = None
    if bf16_weights:
        work = GPT(2, 2, 64, 64, a.vocab).to(torch.bfloat16)
    items = (len(train) - a.seq - 1) // a.seq + 1
    losses, epoch, perm, pos = [], -1, [], 0
    for _ in range(a.steps):
        if pos + a.batch > len(perm):
            epoch += 1
            g = torch.Generator()
            g.manual_seed(a.seed + epoch)
            perm, pos = torch.randperm(items, generator=g).tolist(), 0
        x, y = windows(train, perm[pos:pos + a.batch], a.seq)
        pos += a.batch
        opt.zero_grad(set_to_none=True)
        if work is None:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = model(x, y)
            loss.backward()
        else:
            with torch.no_grad():
                for w, m in zip(work.parameters(), model.parameters()):
                    w.copy_(m)  # rounded to bf16, to nearest even
                    w.grad = None
            loss = work.loss_f32(x, y)
            loss.backward()
            for w, m in zip(work.parameters(), model.parameters()):
                m.grad = w.grad.float()
        opt.step()
        losses.append(loss.item())
    return losses


def dtrain_run(a, init_file, work, precision):
    metrics = os.path.join(work, precision + ".jsonl")
    cmd = [a.cli, "train", "--model", "gpt-micro", "--vocab-size", str(a.vocab), "--seq", str(a.seq),
           "--batch", str(a.batch), "--optimizer", "adamw", "--lr", str(a.lr), "--weight-decay", "0.01",
           "--seed", str(a.seed), "--rng", "torch", "--max-steps", str(a.steps), "--threads", str(a.threads),
           "--data", "tokens:" + os.path.join(a.data, "train.bin"), "--no-eval", "--precision", precision,
           "--log-every", "1", "--progress", "none", "--init-from", init_file, "--metrics", metrics]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    losses = {}
    with open(metrics) as f:
        for line in f:
            r = json.loads(line)
            if r["event"] == "step":
                losses[r["step"]] = r["loss"]
    return [losses[s] for s in range(1, a.steps + 1)]


def gaps(ref, other, window):
    per = [abs(o - r) for r, o in zip(ref, other)]
    big = max(range(len(per)), key=per.__getitem__)
    out = [s + 1 for s, (r, g) in enumerate(zip(ref, per)) if g > 0.02 * abs(r) + 0.01]
    wmax, wstep = 0.0, 1
    for i in range(0, len(ref) - window + 1, window):
        d = abs(sum(other[i:i + window]) - sum(ref[i:i + window])) / window
        if d > wmax:
            wmax, wstep = d, i + 1
    return {"max_gap": per[big], "max_gap_step": big + 1, "max_rel_gap": per[big] / abs(ref[big]),
            "outside": len(out), "first_outside": out[0] if out else None,
            "max_window_gap": wmax, "max_window_from": wstep}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cli", default="build/dtrain")
    p.add_argument("--data", default="build/gpt-data", help="make demo-gpt-data's directory")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--no-dtrain", action="store_true", help="only the PyTorch runs")
    p.add_argument("--init-from", help="the initial weights (safetensors with PyTorch's names) instead of drawing them")
    p.add_argument("--dump", help="write every run's per-step losses to this JSON file")
    a = p.parse_args()
    if min(a.steps, a.batch, a.seq, a.threads, a.window) < 1 or a.seq > 64 or a.window > a.steps:
        sys.exit("torch_gpt_bf16_curve.py: counts are positive, --seq at most 64, --window at most --steps")
    train = read_tokens(os.path.join(a.data, "train.bin"))
    a.vocab = max(4096, int(train.max()) + 1)
    torch.manual_seed(a.seed)
    model = GPT(2, 2, 64, 64, a.vocab)
    model.init_gpt2(2)
    if a.init_from:
        from safetensors.torch import load_file
        w = load_file(a.init_from)
        model.load_state_dict({k: w[k].float() for k in model.state_dict()}, strict=True)
    init_state = {k: v.clone() for k, v in model.state_dict().items()}
    runs = {}
    if not a.no_dtrain:
        with tempfile.TemporaryDirectory() as work:
            init_file = os.path.join(work, "init.safetensors")
            write_safetensors(init_file, list(model.named_parameters()))
            runs["dtrain_f32"] = dtrain_run(a, init_file, work, "fp32")
            runs["dtrain_bf16"] = dtrain_run(a, init_file, work, "bf16")
    other = 1 if a.threads != 1 else 2
    runs["torch_f32"] = torch_run(a, init_state, train, a.threads, False)
    runs["torch_bf16"] = torch_run(a, init_state, train, a.threads, True)
    runs["torch_bf16w"] = torch_run(a, init_state, train, a.threads, True, bf16_weights=True)
    runs[f"torch_f32_x{other}"] = torch_run(a, init_state, train, other, False)
    pairs = [("torch_f32", "torch_bf16"), ("torch_f32", "torch_bf16w"), ("torch_f32", f"torch_f32_x{other}")]
    if not a.no_dtrain:
        pairs = [("dtrain_f32", "dtrain_bf16")] + pairs + [("torch_f32", "dtrain_f32"), ("torch_bf16w", "dtrain_bf16")]
    print(f"gpt-micro (vocab {a.vocab}), {a.steps} steps, B={a.batch} T={a.seq}, AdamW lr {a.lr}, seed {a.seed}, "
          f"{a.threads} threads, PyTorch {torch.__version__}")
    for name, l in runs.items():
        print(f"  {name:16s} loss: step 1 {l[0]:.4f}, step {a.steps} {l[-1]:.4f}")
    res = {}
    for r, o in pairs:
        g = gaps(runs[r], runs[o], a.window)
        res[f"{o}-vs-{r}"] = g
        print(f"{o} vs {r}: largest gap {g['max_gap']:.4f} ({100 * g['max_rel_gap']:.2f}%) at step "
              f"{g['max_gap_step']}; steps outside 2% + 0.01: {g['outside']} (first {g['first_outside']}); "
              f"largest {a.window}-step mean gap {g['max_window_gap']:.4f} (window from step {g['max_window_from']})")
    if a.dump:
        with open(a.dump, "w") as f:
            json.dump(runs, f)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
