#!/usr/bin/env python3
"""PyTorch's bf16 matmul on a GPT-2 training step's GEMM shapes: the peer
of `dtrain bench step --precision bf16`'s peak ("bf16 step shapes").

    $PEER_PYTHON bench/torch_gemm_peak.py [--rows 2048] [--layers 12] [--embd 768]
        [--vocab 50257] [--threads 2] [--reps 3] [--json]

Per layer the four projections' forward (x W), input gradient (g W^T) and
weight gradient (x^T g), each `layers` times, and the tied LM head's
logits (x E^T), input gradient (g E) and embedding gradient (g^T x) once,
at M = rows (= batch x seq), laid out as the step stores them (transposes
as views, no copies). Each product is bf16 x bf16 -> bf16 (torch.matmul
under bf16, as autocast runs a linear). Prints each GEMM's best of --reps
calls after one warm-up and the FLOP-weighted rate over the step
(sum(count x flop) / sum(count x best time)), by wall time and per
CPU-second of the process (all threads: a core's rate, which a busy
machine lowers less), the figures `dtrain bench step` reports as
peak_gflops and peak_cpu_gflops_per_core_s.
"""
import argparse
import json
import time

import torch


def gemms(R, L, C, V):
    """(name, M, N, K, trans_a, trans_b, count) of one step, as dtrain issues them."""
    proj = [("attn.c_attn", C, 3 * C), ("attn.c_proj", C, C), ("mlp.c_fc", C, 4 * C), ("mlp.c_proj", 4 * C, C)]
    out = []
    for name, i, o in proj:
        out.append(("fwd " + name, R, o, i, False, False, L))
    for name, i, o in proj:
        out.append(("bwd-dx " + name, R, i, o, False, True, L))
    for name, i, o in proj:
        out.append(("bwd-dw " + name, i, o, R, True, False, L))
    out.append(("fwd lm_head", R, V, C, False, True, 1))
    out.append(("bwd-dx lm_head", R, C, V, False, False, 1))
    out.append(("bwd-dw lm_head", V, C, R, True, False, 1))
    return out


def operand(rows, cols, trans):
    """A (rows, cols) bf16 operand; stored (cols, rows) and viewed transposed when trans."""
    if trans:
        return (torch.rand(cols, rows) * 2 - 1).to(torch.bfloat16).t()
    return (torch.rand(rows, cols) * 2 - 1).to(torch.bfloat16)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if min(a.rows, a.layers, a.embd, a.vocab, a.threads, a.reps) < 1:
        ap.error("every option must be at least 1")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    sum_flop = sum_s = sum_cpu = 0.0
    for name, M, N, K, ta, tb, count in gemms(a.rows, a.layers, a.embd, a.vocab):
        A, B = operand(M, K, ta), operand(K, N, tb)
        torch.matmul(A, B)  # warm-up: the primitive is built here
        best, c0 = 1e300, time.process_time()
        for _ in range(a.reps):
            t0 = time.perf_counter()
            torch.matmul(A, B)
            best = min(best, time.perf_counter() - t0)
        cpu = (time.process_time() - c0) / a.reps
        flop = 2.0 * M * N * K
        sum_flop += count * flop
        sum_s += count * best
        sum_cpu += count * cpu
        rec = {"bench": "torch_gemm", "gemm": name, "m": M, "n": N, "k": K, "count": count,
               "ms": best * 1e3, "gflops": flop / best * 1e-9, "cpu_gflops_per_core_s": flop / cpu * 1e-9}
        if a.json:
            print(json.dumps(rec))
        else:
            print(f"{name:22s} M {M:6d} N {N:6d} K {K:6d} x{count:<3d} {best * 1e3:9.3f} ms "
                  f"{rec['gflops']:7.1f} GFLOP/s ({rec['cpu_gflops_per_core_s']:.1f} per CPU-second)")
    total = {"bench": "torch_gemm_step", "torch": torch.__version__, "threads": a.threads, "rows": a.rows,
             "gflop": sum_flop * 1e-9, "ms": sum_s * 1e3, "peak_gflops": sum_flop / sum_s * 1e-9,
             "peak_cpu_gflops_per_core_s": sum_flop / sum_cpu * 1e-9}
    if a.json:
        print(json.dumps(total))
    else:
        print(f"step: {total['gflop']:.1f} GFLOP of GEMMs in {total['ms']:.1f} ms, {total['peak_gflops']:.1f} "
              f"GFLOP/s ({total['peak_cpu_gflops_per_core_s']:.1f} per CPU-second), torch {torch.__version__}, "
              f"{a.threads} threads")


if __name__ == "__main__":
    main()
