"""Peer check: do DeepSpeed's ZeRO++ keys run on a CPU? (issue 36)

Starts DeepSpeed (DS_ACCELERATOR=cpu, gloo) on a small MLP with
zero_optimization stage 3 and each ZeRO++ key (zero_quantized_weights,
zero_quantized_gradients, zero_hpz_partition_size), one training step each,
and prints per configuration "ok loss ..." or the error DeepSpeed raised.
Run under torchrun for several ranks, or alone (one rank):
    DS_ACCELERATOR=cpu $PEER_PYTHON bench/ds_zeropp_cpu.py
"""
import os
import sys
import traceback

os.environ.setdefault("DS_ACCELERATOR", "cpu")
for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
             ("MASTER_PORT", "29561")):
    os.environ.setdefault(k, v)
import torch  # noqa: E402
import deepspeed  # noqa: E402

world = int(os.environ["WORLD_SIZE"])
cases = {
    "zero3": {},
    "qwZ": {"zero_quantized_weights": True},
    "qgZ": {"zero_quantized_gradients": True},
    "hpZ": {"zero_hpz_partition_size": max(1, world // 2) if world > 1 else 1},
    "all": {"zero_quantized_weights": True, "zero_quantized_gradients": True,
            "zero_hpz_partition_size": max(1, world // 2)},
}
for name, keys in cases.items():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    cfg = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
           "zero_optimization": dict({"stage": 3}, **keys)}
    try:
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        x = torch.randn(4, 64)
        y = torch.randint(0, 8, (4,))
        loss = torch.nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        print(f"{name}: ok loss {loss.item():.6f}", flush=True)
    except Exception as e:  # report, go on with the next key
        msg = "".join(traceback.format_exception_only(type(e), e)).strip().splitlines()[-1]
        print(f"{name}: refused: {msg[:300]}", flush=True)
sys.exit(0)
