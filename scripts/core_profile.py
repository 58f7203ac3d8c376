#!/usr/bin/env python
"""Where each operator's fast core spends its time: matrix products against everything else.

For every operator of the registry (or those named), one forward+backward of its core at the
bench's shape (B=1, H=6, d=64) runs under torch's profiler; the ATen ops' self times are split
into matrix products (bmm, mm, their add- variants, triangular solves, SDPA's kernels) and the
rest (feature maps, gates, normalisation, copies: memory-bound passes over (N, d) tensors).

    products share   the part of the core's time spent in its matrix products
    share ceiling    the share of its FLOP bound the core would reach if everything but its
                     products took no time: its measured share / products share

The measured share comes from `linvit bench` (ratios.md), passed with --shares name=value; without
it only the time split is printed. A ceiling above an operator's goal says the goal is reachable
by fusing the rest; below it, that its products alone are too slow (deltanet_ceiling.py times
deltanet's products bare, arranged as favourably as the algorithm allows).

Cores in linvit's C++ kernels (the feature-map family, gla, mamba2 and deltanet on the CPU in
float32) show as the kernels' ops (linvit_cpu::linear_forward, gated_backward, ...), products and
all: the profiler cannot split them, so they get no ceiling here (scripts/cpp_kernel_ab.py times
them against the PyTorch paths; LINVIT_CPP=0 profiles those).

    .venv/bin/python scripts/core_profile.py [--tokens 4096] [--shares linear=0.39 ...] [NAME ...]
"""
from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from linvit.attention import OPERATORS
from linvit.bench.measure import keep_freed_memory
from linvit.bench.operators import make_operator, make_step

PRODUCTS = {"aten::mm", "aten::bmm", "aten::baddbmm", "aten::addmm", "aten::addbmm",
            "aten::linalg_solve_triangular", "aten::_scaled_dot_product_flash_attention_for_cpu",
            "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}


def split(name: str, tokens: int, calls: int) -> tuple[float, float, list[tuple[str, float]]]:
    """(ms per call, products' share of it, the three costliest other ops with their shares)."""
    device = torch.device("cpu")
    step = make_step(make_operator(name, 6, 64, tokens, device), 1, tokens, 64, device, "core")
    for _ in range(2):
        step()                                               # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    products = sum(e.self_cpu_time_total for e in events if e.key.rstrip("_") in PRODUCTS)
    rest = sorted((e for e in events if e.key.rstrip("_") not in PRODUCTS),
                  key=lambda e: -e.self_cpu_time_total)[:3]
    return (total / calls / 1e3, products / total,
            [(e.key.removeprefix("aten::"), e.self_cpu_time_total / total) for e in rest])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", default=[n for n in OPERATORS if n != "softmax"])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--shares", nargs="*", default=[], metavar="NAME=SHARE",
                        help="each operator's measured share of its FLOP bound (ratios.md)")
    args = parser.parse_args()
    for name in args.names:
        if name not in OPERATORS:
            parser.error(f"unknown operator {name!r}; known: {', '.join(OPERATORS)}")
    try:
        shares = {k: float(v) for k, v in (s.split("=", 1) for s in args.shares)}
    except ValueError:
        parser.error("--shares takes NAME=NUMBER pairs, e.g. linear=0.39")
    keep_freed_memory()                                      # as `linvit bench` does
    print(f"N={args.tokens}, B=1 H=6 d=64, fwd+bwd, {torch.get_num_threads()} threads, "
          f"{args.calls} profiled calls (the profiler's overhead is in the times)")
    print("| operator | ms | products share | share | share ceiling | costliest other ops |")
    print("|---|---:|---:|---:|---:|---|")
    for name in args.names:
        ms, products, rest = split(name, args.tokens, args.calls)
        share = shares.get(name)
        ceiling = f"{share / products:.2f}" if share is not None else ""
        others = ", ".join(f"{k} {v:.2f}" for k, v in rest)
        print(f"| {name} | {ms:.1f} | {products:.2f} | {share if share is not None else ''} | "
              f"{ceiling} | {others} |", flush=True)


if __name__ == "__main__":
    main()
