#!/usr/bin/env python3
"""Check a Hugging Face model directory that dtrain wrote (--save-hf or
dtrain ckpt convert --hf) with transformers: it loads with
AutoModelForCausalLM.from_pretrained and no missing, unexpected or
mismatched keys, and its mean next-token loss over the llm.c token file's
disjoint (T+1)-token windows equals the loss dtrain reported (relative 1e-5).

Usage: $PEER_PYTHON scripts/check_hf_export.py OUT TOKENS.bin T DTRAIN_LOSS
"""
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM

out, tokpath, T, want = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
model.eval()
bad = {k: v for k, v in info.items() if v}
print("loading info:", {k: (sorted(v) if isinstance(v, (set, list)) else v) for k, v in info.items()})
raw = open(tokpath, "rb").read()
toks = np.frombuffer(raw[1024:], dtype=np.uint16).astype(np.int64)
n = (len(toks) - 1) // T
tot = 0.0
with torch.no_grad():
    for w in range(n):
        x = torch.tensor(toks[w * T:w * T + T + 1]).unsqueeze(0)
        lg = model(x[:, :T]).logits
        tot += torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), x[0, 1:]).item()
got = tot / n
rel = abs(got - want) / abs(want)
print(f"{type(model).__name__}: transformers loss {got:.9g}, dtrain {want:.9g}, relative difference {rel:.3g}")
sys.exit(1 if bad or rel > 1e-5 else 0)
