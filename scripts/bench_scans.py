"""What two changes to the gated and delta-rule CPU paths buy, each undone in turn, side by side in
one run: images per second of a whole training step (model, cross-entropy, backward, timm's AdamW),
medians of interleaved repeats with their range.

    .venv/bin/python scripts/bench_scans.py [--operators gla mamba2 deltanet] [--size cpu96]
        [--img-size 28] [--in-chans 1] [--batch 32] [--threads 1] [--steps 6] [--repeats 5]

Variants (every one trains the same model from the same weights on the same batches):
  current               the chunk length per sequence length (ops.chunks.chunk_size) and gla's
                        gates through ops.definitions.log_sigmoid
  fixed longest chunk   chunks of the longest length, the last one padded (gla and mamba2: 64,
                        deltanet: 32), as before chunk_size
  F.logsigmoid gates    gla only: its gates through F.logsigmoid, as before log_sigmoid
28 px in 4 px patches is 50 tokens (one chunk of 50, not 64; deltanet 2 x 25, not 2 x 32);
`--size deit_t --img-size 224 --in-chans 3` is 197 (4 x 50, not 4 x 64). Measurements go to a
dated page under docs/.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from timm.optim import create_optimizer_v2  # noqa: E402

import linvit.attention.gla as gla  # noqa: E402
import linvit.ops.delta_rule as delta_rule  # noqa: E402
import linvit.ops.gated_scan as gated_scan  # noqa: E402
from linvit.models import ModelSpec, create_vit  # noqa: E402


def fixed(tokens: int, longest: int) -> int:
    return longest


# variant -> the (module, name, stand-in) patches that undo one change while it runs
VARIANTS = {
    "current": [],
    "fixed longest chunk": [(gated_scan, "chunk_size", fixed), (delta_rule, "chunk_size", fixed)],
    "F.logsigmoid gates": [(gla, "log_sigmoid", F.logsigmoid)],
}


def applies(variant: str, operator: str) -> bool:
    return variant != "F.logsigmoid gates" or operator == "gla"


def step_fn(args, operator: str, batches):
    torch.manual_seed(0)
    model = create_vit(ModelSpec(args.size, operator, 10, args.img_size, args.in_chans))
    optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
    model.train()

    def run():
        for images, labels in batches:
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return run


def timed(run, variant: str) -> float:
    saved = [(module, name, getattr(module, name)) for module, name, _ in VARIANTS[variant]]
    for module, name, stand_in in VARIANTS[variant]:
        setattr(module, name, stand_in)
    try:
        start = time.perf_counter()
        run()
        return time.perf_counter() - start
    finally:
        for module, name, current in saved:
            setattr(module, name, current)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--operators", nargs="+", default=["gla", "mamba2", "deltanet"])
    p.add_argument("--size", default="cpu96")
    p.add_argument("--img-size", type=int, default=28)
    p.add_argument("--in-chans", type=int, default=1)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=1, help="a cell's run.threads")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(args.batch, args.in_chans, args.img_size, args.img_size, generator=g),
                torch.randint(0, 10, (args.batch,), generator=g)) for _ in range(args.steps)]
    runs = {(op, v): step_fn(args, op, batches)
            for op in args.operators for v in VARIANTS if applies(v, op)}
    for (_, variant), run in runs.items():         # warm-up pass (allocator, caches)
        timed(run, variant)
    times = {key: [] for key in runs}
    keys = list(runs)
    for r in range(args.repeats):
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:
            times[key].append(timed(runs[key], key[1]) / args.steps)
    print(f"{args.size} {args.img_size}px batch {args.batch}, {args.threads} thread(s), "
          f"{args.steps} steps x {args.repeats} interleaved repeats; ratio: current over variant")
    for (op, variant), ts in times.items():
        med = statistics.median(ts)
        ratio = med / statistics.median(times[(op, "current")])
        print(f"{op:9s} {variant:20s} {args.batch / med:8.1f} img/s  "
              f"[{args.batch / max(ts):.1f}, {args.batch / min(ts):.1f}]  x{ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
