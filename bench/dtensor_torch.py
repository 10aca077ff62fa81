#!/usr/bin/env python3
"""Every reshard transition and matmul propagation case of dtrain against
PyTorch's DTensor (torch >= 2.4: torch.distributed.tensor) on a CPU
DeviceMesh with gloo.

    dtrain run -n 4 -- build/bench/dtensor_dump /tmp/dump4
    "$PEER_PYTHON" bench/dtensor_torch.py /tmp/dump4 4

For each case dtensor_dump wrote (one line per rank), this script builds the
same source in DTensor (DTensor.from_local with the same local pieces,
global shape and stride given, so uneven shards are torch.chunk's), runs
redistribute (or torch.matmul), and compares:
  - reshard to a target without Partial: each rank's local piece, exactly;
  - reshard to a Partial target: the full tensor (the pieces differ by
    design: Paddle's and dtrain's R->P keep the value on coordinate 0,
    DTensor divides it by k);
  - matmul: the output placement each chose, and the full result.
Cases DTensor refuses (it raises) are counted apart with the message.
Prints a summary; exit code 0 when every comparable case agrees in values.
Needs no GPU; never part of the build or tests."""
import json
import os
import sys
from collections import defaultdict

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.tensor import DeviceMesh, DTensor, Partial, Replicate, Shard


def val(i):
    return float(((i * 7) % 23 + 23) % 23 - 11)


def placements(code):
    out = []
    for c in code.split(","):
        if c == "R":
            out.append(Replicate())
        elif c == "P":
            out.append(Partial())
        else:
            out.append(Shard(int(c[1:])))
    return out


def code_of(pl):
    out = []
    for p in pl:
        if isinstance(p, Replicate):
            out.append("R")
        elif isinstance(p, Partial):
            out.append("P")
        else:
            out.append("S%d" % p.dim)
    return ",".join(out)


def chunk(n, k, i):
    c = -(-n // k)
    s = min(i * c, n)
    e = min((i + 1) * c, n)
    return s, e - s


def source(mesh, pl, shape):
    """This rank's piece of global X with placements pl, as dtensor_dump makes it."""
    X = torch.tensor([val(i) for i in range(int(torch.tensor(shape).prod()))]).reshape(shape)
    coords = mesh.get_coordinate()
    piece = X
    r, K = 0, 1
    for i, p in enumerate(pl):
        if isinstance(p, Shard):
            s, l = chunk(shape[p.dim], mesh.size(i), coords[i])
            piece = piece.narrow(p.dim, s, l)
        elif isinstance(p, Partial):
            r = r * mesh.size(i) + coords[i]
            K *= mesh.size(i)
    piece = piece.contiguous().clone()
    if K > 1:
        piece = piece - (K - 1) if r == 0 else torch.ones_like(piece)
    stride = X.stride()
    return DTensor.from_local(piece, mesh, pl, run_check=False, shape=torch.Size(shape), stride=stride)


def worker(rank, world, cases, port, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    meshes = {}
    res = []
    for key, c in cases:
        mshape = tuple(c["mesh"])
        if mshape not in meshes:
            meshes[mshape] = DeviceMesh("cpu", torch.arange(world).reshape(mshape))
        mesh = meshes[mshape]
        try:
            if c["kind"] == "reshard":
                x = source(mesh, placements(c["from"]), c["shape"])
                y = x.redistribute(mesh, placements(c["to"]))
                loc = y.to_local().reshape(-1).tolist()
                full = y.full_tensor().reshape(-1).tolist()
                res.append((key, "ok", loc, full, None))
            else:
                a = source(mesh, placements(c["a"]), [5, 7])
                b = source(mesh, placements(c["b"]), [7, 3])
                y = torch.matmul(a, b)
                res.append((key, "ok", None, y.full_tensor().reshape(-1).tolist(), code_of(y.placements)))
        except Exception as e:  # DTensor refuses some cases on purpose
            res.append((key, "error", None, None, "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:120])))
    out.put((rank, res))
    dist.barrier()
    dist.destroy_process_group()


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    d, world = sys.argv[1], int(sys.argv[2])
    ours = defaultdict(dict)  # key -> rank -> line
    for r in range(world):
        with open(os.path.join(d, "rank%d.jsonl" % r)) as f:
            for line in f:
                c = json.loads(line)
                if c["kind"] == "reshard":
                    key = ("reshard", tuple(c["mesh"]), tuple(c["shape"]), c["from"], c["to"])
                else:
                    key = ("matmul", tuple(c["mesh"]), c["a"], c["b"])
                ours[key][c["rank"]] = c
    cases = [(k, v[0]) for k, v in ours.items()]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=worker, args=(r, world, cases, port, q)) for r in range(world)]
    for p in procs:
        p.start()
    theirs = defaultdict(dict)
    for _ in range(world):
        r, res = q.get()
        for key, st, loc, full, extra in res:
            theirs[key][r] = (st, loc, full, extra)
    for p in procs:
        p.join()
    n_eq = n_diff = n_err = n_place = 0
    for key, per in ours.items():
        t = theirs[key]
        if any(t[r][0] == "error" for r in t):
            n_err += 1
            print("torch refuses %s: %s" % (key, t[0][3]))
            continue
        bad = []
        for r, c in per.items():
            st, loc, full, extra = t[r]
            if key[0] == "reshard":
                if "full" in c:
                    if c["full"] != full:
                        bad.append("rank %d full %s vs torch %s" % (r, c["full"], full))
                elif c["local"] != loc:
                    bad.append("rank %d local %s vs torch %s" % (r, c["local"], loc))
            else:
                if c["full"] != full:
                    bad.append("rank %d full differs" % r)
                if r == 0 and c["out"] != extra:
                    n_place += 1
                    print("matmul %s x %s: dtrain chose %s, torch %s (values equal: %s)"
                          % (key[2], key[3], c["out"], extra, c["full"] == full))
        if bad:
            n_diff += 1
            print("DIFFERENT %s: %s" % (key, "; ".join(bad[:2])))
        else:
            n_eq += 1
    print("world %d: %d cases equal, %d different, %d refused by torch; %d matmul cases with a "
          "different output placement" % (world, n_eq, n_diff, n_err, n_place))
    return 1 if n_diff else 0


if __name__ == "__main__":
    sys.exit(main())
