"""linvit's training step against a bare eager timm loop on the same batches, side by side in one
run: images per second of a default cell's step (model, label-smoothed cross-entropy, backward,
timm's AdamW), medians of interleaved repeats, and what a compiled step gains over a whole cell
once its compile time is paid.

    .venv/bin/python scripts/bench_step.py [--operator gla] [--size cpu96] [--batch 128]
        [--threads 1] [--steps 8] [--repeats 5] [--backend inductor] [--cell-steps 46]
        [--device cuda]     (on a GPU: both loops under bf16 autocast, as linvit trains there)

Variants, each timed over the same `--steps` batches in every repeat (order rotated per repeat):
  timm eager       model(x), F.cross_entropy, zero_grad, backward, optimizer.step: the bare loop
  linvit eager     linvit.train.loop.train_one_epoch (meters, scheduler, checks) on the same model
  linvit compiled  the same with the objective under torch.compile (run.compile=<backend>)
  linvit fused     eager, with torch's fused AdamW kernel (fused=True)
  linvit bf16      (CPU) eager under bf16 autocast, as run.amp=auto trains on a CPU with
                   AVX512-BF16 and no AMX (runs.runtime.bf16_pays)
  linvit no C++    (CPU) eager with linvit's C++ kernels turned off (the PyTorch cores, as
                   LINVIT_CPP=0 runs): what the kernels give the step of an operator that has
                   one (every other variant runs them where they load)
Prints each variant's median images/s with its range, the ratio to timm eager, and for the
compiled step the compile time and its ratio over a cell of `--cell-steps` steps (the default
grid's cell: 6,000 images in batches of 128). Measurements go to a dated page under docs/.
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
from timm.scheduler import create_scheduler_v2  # noqa: E402

from linvit.models import ModelSpec, create_vit  # noqa: E402
from linvit.ops import cpp_kernels  # noqa: E402
from linvit.runs.runtime import Runtime  # noqa: E402
from linvit.train.loop import train_one_epoch  # noqa: E402
from linvit.train.objectives import ClassificationObjective  # noqa: E402

SMOOTHING, LR, WD = 0.1, 1e-3, 0.05


class Batches:
    """The loader interface train_one_epoch reads, over fixed in-memory batches."""

    def __init__(self, batches):
        self._batches = batches

    def __len__(self):
        return len(self._batches)

    def batches(self, epoch):
        return iter(self._batches)


def build(args, **opt_kwargs):
    torch.manual_seed(0)
    model = create_vit(ModelSpec(args.size, args.operator, 10, args.img_size, args.in_chans))
    model.to(args.device)
    optimizer = create_optimizer_v2(model, opt="adamw", lr=LR, weight_decay=WD, **opt_kwargs)
    return model, optimizer


def timm_eager(args, batches):
    model, optimizer = build(args)
    model.train()

    def run():
        for images, labels in batches:
            with torch.autocast(args.device, torch.bfloat16, enabled=args.device == "cuda"):
                logits = model(images)
            loss = F.cross_entropy(logits.float(), labels, label_smoothing=SMOOTHING)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return run


def linvit_step(args, batches, backend=None, bf16=None, **opt_kwargs):
    model, optimizer = build(args, **opt_kwargs)
    scheduler, _ = create_scheduler_v2(optimizer, sched="cosine", num_epochs=1000,
                                       step_on_epochs=False, updates_per_epoch=len(batches))
    module = ClassificationObjective(model, SMOOTHING)
    if backend:
        module = torch.compile(module, backend=backend)
    amp = torch.bfloat16 if args.device == "cuda" or bf16 else None
    rt, loader = Runtime(torch.device(args.device), amp_dtype=amp, progress=False), Batches(batches)
    params = [p for p in model.parameters() if p.requires_grad]
    epoch = iter(range(10**6))
    return lambda: train_one_epoch(module, loader, optimizer, scheduler, next(epoch), rt,
                                   params=params)


def seconds(fn) -> float:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--operator", default="gla")
    p.add_argument("--size", default="cpu96")
    p.add_argument("--img-size", type=int, default=28)
    p.add_argument("--in-chans", type=int, default=1)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--threads", type=int, default=1, help="a default cell's run.threads")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--backend", default="inductor")
    p.add_argument("--cell-steps", type=int, default=46)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(args.batch, args.in_chans, args.img_size, args.img_size,
                            generator=g).to(args.device),
                torch.randint(0, 10, (args.batch,), generator=g).to(args.device))
               for _ in range(args.steps)]
    variants = {"timm eager": timm_eager(args, batches),
                "linvit eager": linvit_step(args, batches),
                "linvit fused": linvit_step(args, batches, fused=True)}
    if args.device == "cpu":
        variants["linvit bf16"] = linvit_step(args, batches, bf16=True)
        variants["linvit no C++"] = cpp_kernels.disabled()(linvit_step(args, batches))
    compiled = linvit_step(args, batches, backend=args.backend)
    compile_s = seconds(compiled)             # first pass: tracing and code generation included
    variants[f"linvit compiled ({args.backend})"] = compiled
    for fn in variants.values():              # warm-up pass (allocator, caches)
        fn()
    times = {name: [] for name in variants}
    names = list(variants)
    for r in range(args.repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(seconds(variants[name]) / args.steps)
    base = statistics.median(times["timm eager"])
    print(f"{args.operator} {args.size} batch {args.batch} {args.img_size}px on {args.device}, "
          f"{args.threads} thread(s), {args.steps} steps x {args.repeats} interleaved repeats")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:28s} {args.batch / med:8.1f} img/s  [{args.batch / max(ts):.1f}, "
              f"{args.batch / min(ts):.1f}]  x{base / med:.3f} timm eager")
    step = statistics.median(times[f"linvit compiled ({args.backend})"])
    first = compile_s - step * args.steps      # the first pass beyond its steps' own time
    eager = statistics.median(times["linvit eager"])
    cell = step * args.cell_steps + first
    print(f"compile time {first:.1f} s; over a cell of {args.cell_steps} steps the compiled step "
          f"is x{eager * args.cell_steps / cell:.3f} linvit eager "
          f"(x{base * args.cell_steps / cell:.3f} timm eager)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
