"""PyTorch's context parallelism on CPU (the peer of `dtrain train --cp`):
torch.distributed.tensor.experimental.context_parallel over a gloo group of
2 processes, on the causal attention of a small block (x -> qkv Linear ->
scaled_dot_product_attention), forward and backward; first with the default
SDPA backend, then with the math one. Prints, per attempt, "ok" or the
error PyTorch raises (as of torch 2.15 on CPU both are refused: the CPU
flash kernel has no sharding strategy, and the math path mixes plain
tensors with DTensors).

    $PEER_PYTHON bench/torch_context_parallel.py [SEQ]
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F


def run(rank, world, T):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.attention import SDPBackend, sdpa_kernel

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    B, H, D = 1, 4, 32
    lin = torch.nn.Linear(H * D, 3 * H * D)

    def attn(x):
        q, k, v = lin(x).view(B, -1, 3, H, D).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    for name, backend in (("default SDPA", None), ("math SDPA", SDPBackend.MATH)):
        x = torch.randn(B, T, H * D)
        try:
            if backend is None:
                with context_parallel(mesh, buffers=[x], buffer_seq_dims=[1]):
                    attn(x).sum().backward()
            else:
                with sdpa_kernel(backend), context_parallel(mesh, buffers=[x], buffer_seq_dims=[1]):
                    attn(x).sum().backward()
            msg = "ok"
        except Exception as e:  # the refusal is the result
            msg = "refused: %s: %s" % (type(e).__name__, str(e).splitlines()[0][:200])
        if rank == 0:
            print("torch %s, context_parallel on CPU (gloo, cp %d, T %d), %s: %s" % (torch.__version__, world, T, name,
                                                                                     msg), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(2, int(sys.argv[1]) if len(sys.argv) > 1 else 64), nprocs=2)
