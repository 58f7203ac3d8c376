#!/usr/bin/env python
"""linvit's C++ CPU kernels against the PyTorch paths they replace, in one run.

For each operator whose CPU core has a kernel (the feature-map family: linear attention's kernel,
and the gated scan's and delta rule's for gla, mamba2 and deltanet), one forward+backward of its
core (`global_mix`) on fixed random q, k, v at the given shape, timed with the kernels and with
them turned off (what LINVIT_CPP=0 runs: the fused PyTorch Function, the PyTorch chunks),
interleaved over rounds; SDPA softmax at the same shape gives each its share of the FLOP bound
(as `linvit bench` reports it). Prints medians.

    .venv/bin/python scripts/cpp_kernel_ab.py [--batch 1] [--heads 6] [--tokens 4096]
        [--head-dim 64] [--threads 2] [--rounds 7] [--no-softmax] [--operators gla ...]
    # the default cell's attention shape: --batch 128 --heads 3 --tokens 50 --head-dim 32
    #   --threads 1 --no-softmax
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from linvit.attention import OPERATORS
from linvit.bench.measure import keep_freed_memory
from linvit.bench.ratios import flop_bound
from linvit.ops import cpp_kernels

KERNEL_FAMILIES = {"feature map", "gated", "state space", "delta rule"}
WITH_KERNEL = [n for n, op in OPERATORS.items() if op.family in KERNEL_FAMILIES]


def core_step(name: str, args):
    op = OPERATORS[name](args.heads * args.head_dim, num_heads=args.heads)
    g = torch.Generator().manual_seed(0)
    shape = (args.batch, args.heads, args.tokens, args.head_dim)
    q, k, v = (torch.randn(shape, generator=g).requires_grad_() for _ in range(3))
    grad = torch.randn(shape, generator=g)
    own = [p for n, p in op.named_parameters() if n in op.operator_specific_parameters()]

    def step():
        out = op.global_mix(q, k, v)
        torch.autograd.grad(out, [q, k, v, *own], grad, allow_unused=True)
    return step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in (("batch", 1), ("heads", 6), ("tokens", 4096), ("head-dim", 64),
                          ("threads", 2), ("rounds", 7), ("calls", 3)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--no-softmax", action="store_true", help="skip SDPA (no shares printed)")
    p.add_argument("--operators", nargs="+", choices=WITH_KERNEL, default=WITH_KERNEL)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()                                  # as `linvit bench` does
    if not cpp_kernels.load():
        raise SystemExit(f"the kernel does not load here: {cpp_kernels.status()}")
    steps = {} if args.no_softmax else {("softmax", "sdpa"): core_step("softmax", args)}
    for name in args.operators:
        step = core_step(name, args)
        steps[(name, "kernel")], steps[(name, "pytorch")] = step, cpp_kernels.disabled()(step)
    times = {key: [] for key in steps}
    for _ in range(args.rounds):
        for key, fn in steps.items():
            fn()                                         # warm
            start = time.perf_counter()
            for _ in range(args.calls):
                fn()
            times[key].append((time.perf_counter() - start) / args.calls)
    med = {key: statistics.median(t) for key, t in times.items()}
    sdpa = med.get(("softmax", "sdpa"))
    print(f"B={args.batch} H={args.heads} N={args.tokens} d={args.head_dim}, "
          f"{args.threads} thread(s), fwd+bwd, median of {args.rounds} rounds")
    for name in args.operators:
        on, off = med[(name, "kernel")], med[(name, "pytorch")]
        line = f"  {name:9s} kernel {on * 1e3:8.2f} ms  pytorch {off * 1e3:8.2f} ms  " \
               f"x{off / on:.2f}"
        if sdpa:
            bound = flop_bound(name, args.tokens, args.head_dim)
            line += f"   share {sdpa / on / bound:.2f} (pytorch {sdpa / off / bound:.2f})"
        print(line)


if __name__ == "__main__":
    main()
