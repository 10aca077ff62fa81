#!/usr/bin/env python3
"""The seed 001 placement programs in PaddlePaddle (CPU build from PyPI), to
set beside examples/dtensor_placements.c:

    "$PEER_PYTHON" -m paddle.distributed.launch --nproc_per_node 2 \
        bench/paddle_seed_placements.py            # Shard(0), Shard(1), P->R, S(0)->R
    "$PEER_PYTHON" -m paddle.distributed.launch --nproc_per_node 2 \
        bench/paddle_seed_placements.py shard2     # Shard(2) of a 2-d tensor

Each rank prints its local values (in the launcher's workerlog.<rank>).
Never part of the build or tests."""
import sys

import paddle
import paddle.distributed as dist

dist.init_parallel_env()
rank = dist.get_rank()
mesh = dist.ProcessMesh([0, 1], dim_names=["x"])
dense_tensor = paddle.to_tensor([[1, 2, 3], [4, 5, 6]])
if len(sys.argv) > 1 and sys.argv[1] == "shard2":
    try:
        t = dist.shard_tensor(dense_tensor, mesh, [dist.Shard(2)])
        print("rank", rank, "Shard(2)", t._local_value().numpy().tolist(), flush=True)
    except Exception as e:
        print("rank", rank, "Shard(2) error:", type(e).__name__, str(e)[:200], flush=True)
    x = paddle.ones([2])
    dist.all_reduce(x)
    print("rank", rank, "all_reduce after it:", x.numpy().tolist(), flush=True)
    sys.exit(0)
for d in (0, 1):
    t = dist.shard_tensor(dense_tensor, mesh, [dist.Shard(d)])
    print("rank", rank, "Shard(%d)" % d, t._local_value().numpy().tolist(), flush=True)
p = dist.shard_tensor(dense_tensor, mesh, [dist.Partial()])
print("rank", rank, "Partial local", p._local_value().numpy().tolist(), flush=True)
print("rank", rank, "Partial -> Replicate",
      dist.reshard(p, mesh, [dist.Replicate()])._local_value().numpy().tolist(), flush=True)
s = dist.shard_tensor(dense_tensor, mesh, [dist.Shard(0)])
print("rank", rank, "Shard(0) -> Replicate",
      dist.reshard(s, mesh, [dist.Replicate()])._local_value().numpy().tolist(), flush=True)
