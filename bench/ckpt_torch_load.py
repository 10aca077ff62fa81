"""Reads a dtrain full state dict with the `safetensors` package and loads it
into the PyTorch twin of dtrain's ConvNet (bench/torch_ref.py) with
load_state_dict(strict=True): the names, shapes and dtypes dtrain writes are
PyTorch's. Reference only, never a build or test dependency.

    dtrain train --model convnet --max-steps 3 --save run
    "$PEER_PYTHON" bench/ckpt_torch_load.py run/step-00000003/model.safetensors
    # a sharded checkpoint directory (index.json) first becomes one file:
    dtrain ckpt convert CKPT_DIR -o convnet.safetensors --full

Keys that are not model state (optimizer moments "optim.*", run state) are
listed and left out; every model key must be present (strict). Prints each
tensor's name, shape and a checksum, and the logits of one all-zeros image
(compare with dtrain's forward on the same weights)."""
import os
import sys

import torch
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ref import ConvNet  # noqa: E402


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sd = load_file(sys.argv[1])
    model = ConvNet()
    keys = set(model.state_dict().keys())
    extra = sorted(k for k in sd if k not in keys)
    state = {k: v for k, v in sd.items() if k in keys}
    model.load_state_dict(state, strict=True)
    for k, v in model.state_dict().items():
        print(f"{k:32s} {str(tuple(v.shape)):18s} {str(v.dtype):14s} sum {v.double().sum().item():.6f}")
    if extra:
        print(f"not model state ({len(extra)}): {', '.join(extra[:6])}{' ...' if len(extra) > 6 else ''}")
    model.eval()
    with torch.no_grad():
        print("logits(zeros):", [round(x, 6) for x in model(torch.zeros(1, 1, 28, 28))[0].tolist()])
    print("load_state_dict(strict=True): ok")


if __name__ == "__main__":
    main()
