#!/usr/bin/env python
"""How fast deltanet's chunked PyTorch path could be at best, against SDPA softmax, in one run.

Issue 11 asked every new operator's core to run >= 8x faster than SDPA (forward+backward, B=1,
H=6, d=64, N=4096, 2-core CPU). This script bounds what deltanet's chunked PyTorch path can
reach: it times only the matrix products that path must do (and its one triangular solve), each
as a bare torch.bmm into a preallocated output, arranged as favourably as the dependencies allow
(everything that does not wait for the chunk loop as one product over all chunks, the loop's
two dependent products per chunk as small ones), and nothing else: no gates, normalisation,
masks, dot products, reindexing or allocation. SDPA / (that time) bounds the ratio of any
implementation that runs these products as batched bmm calls over all chunks. It is not a bound
for linvit's C++ kernel (csrc/delta_rule.cpp), which runs them chunk by chunk with the chunk in
cache and measures above it (docs/2026-12-05-cpp-scans.md). The real core is timed beside it,
with the kernel (the CPU default) and without (the PyTorch chunks).

The forward products are checked against DeltaNetAttention.core_flops, the FLOP count the bench
states, before anything is timed; the backward products are those written out in
linvit.ops.delta_rule._ChunkedDeltaRule.backward.

    .venv/bin/python scripts/deltanet_ceiling.py [--tokens 4096] [--chunk 32] [--rounds 9]
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from linvit.attention import OPERATORS
from linvit.bench.measure import keep_freed_memory
from linvit.bench.operators import make_operator, make_step
from linvit.ops import cpp_kernels, delta_rule


def products(tokens: int, chunk: int, heads: int, d: int):
    """(count, batch, m, k, n) of the chunked path's matrix products, forward then backward,
    both scan directions stacked (2 * heads), and the loop's (steps, batch, m, k, n)."""
    n, g = tokens // chunk, 2 * heads
    c = chunk
    forward = [(2, n * g, c, d, c),        # K K^T, Q K^T
               (3, n * g, c, c, d),        # T beta K, T beta V, P N
               (1, n * g, c, d, d)]        # Q S_in
    backward = [(2, n * g, c, d, c),       # dO N^T, Z N^T
                (5, n * g, c, c, d),       # P^T dO, T^T dN, (X + X^T) K, dP^T Q, dP K
                (2, n * g, c, d, d),       # dO S_in^T, Z S_in^T
                (2, n * g, d, c, d)]       # Q^T dO, N G^T
    loop = [(n, g, c, d, d), (n, g, d, c, d)]     # N = U - W S and S + K^T N; dN += K G, W^T dN
    return forward, backward, loop


def check_flops(forward, loop, tokens: int, chunk: int, heads: int, d: int) -> None:
    """The forward products, the loop's and the solve (C^3 per chunk and direction) must be the
    FLOPs the bench states for deltanet: else this bound describes some other algorithm."""
    count = sum(2 * c * b * m * k * n for c, b, m, k, n in forward)
    count += sum(2 * s * b * m * k * n for s, b, m, k, n in loop)
    count += (tokens // chunk) * 2 * heads * chunk ** 3
    stated = heads * OPERATORS["deltanet"].core_flops(tokens, d)
    if abs(count - stated) > 1e-9 * stated:
        raise SystemExit(f"products count {count:.4g} FLOPs, core_flops states {stated:.4g}")


def products_step(forward, backward, loop, chunk: int):
    """One call of every product, outputs preallocated; the loop runs twice (forward and
    backward pass), two dependent products per step each time."""
    big = [(c, torch.randn(b, m, k), torch.randn(b, k, n), torch.empty(b, m, n))
           for c, b, m, k, n in forward + backward]
    steps, g, c, d, _ = loop[0]
    w, u, k = (torch.randn(steps, g, c, d) for _ in range(3))
    s = torch.randn(steps, g, d, d)
    lower = torch.randn(steps * g, chunk, chunk).tril_(-1)
    eye = torch.eye(chunk).expand_as(lower)

    def step():
        for count, a, b, out in big:
            for _ in range(count):
                torch.bmm(a, b, out=out)
        torch.linalg.solve_triangular(lower, eye, upper=False, unitriangular=True)
        for _ in range(2):
            for i in range(steps):
                u[i].baddbmm_(w[i], s[i], alpha=-1)
                s[i].baddbmm_(k[i].mT, u[i])
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=delta_rule.CHUNK)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    heads, d, device = 6, 64, torch.device("cpu")
    if args.tokens % args.chunk:
        raise SystemExit("--tokens must be a multiple of --chunk")
    # the operator and its FLOP count read the chunk size at call time: both take --chunk
    delta_rule.CHUNK = sys.modules["linvit.attention.deltanet"].CHUNK = args.chunk
    forward, backward, loop = products(args.tokens, args.chunk, heads, d)
    check_flops(forward, loop, args.tokens, args.chunk, heads, d)
    keep_freed_memory()                                  # as `linvit bench` does, for every row
    steps = {"products only": products_step(forward, backward, loop, args.chunk)}
    for name in ("softmax", "deltanet"):
        op = make_operator(name, heads, d, args.tokens, device)
        steps[f"{name} core"] = make_step(op, 1, args.tokens, d, device, "core")
    steps["deltanet chunks"] = cpp_kernels.disabled()(steps["deltanet core"])
    times = {name: [] for name in steps}
    for _ in range(args.rounds + 2):                     # interleaved; the first two warm up
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    median = {name: sorted(t[2:])[len(t[2:]) // 2] for name, t in times.items()}
    sdpa = median["softmax core"]
    print(f"N={args.tokens} chunk={args.chunk} heads={heads} d={d} threads="
          f"{torch.get_num_threads()}, fwd+bwd, median of {args.rounds}")
    for name, seconds in median.items():
        print(f"  {name:15s} {seconds * 1e3:8.1f} ms   SDPA / this {sdpa / seconds:6.2f}x")


if __name__ == "__main__":
    main()
