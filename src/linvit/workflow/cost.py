"""`linvit plan`: what a grid costs before it is submitted. For every job of the plan
(linvit.workflow.plan), its stage's resolved config gives the model, images and epochs; the FLOPs
are counted like the time-to-accuracy curves' (linvit.models.flops: matrix products, a training
image 3 forwards), then turned into device-hours at a stated throughput, and each training job's
peak memory is estimated from the same counts. Tables per stage and per grid axis.

Assumptions, printed with the tables: the throughput (`plan.tflops`, effective FLOP/s of one
device; this project has no GPU measurement of its own to default to); memory of a training job
= 16 bytes per trained parameter (float32 weights, gradients, AdamW's two moments) + 4 per frozen
one + activations of the whole batch on one device, 34 N d bytes per block and image (Korthikanti
et al. 2022, 16-bit activations) + 5 H N^2 where softmax keeps its map. Not costed: dense tasks
(their heads are mmseg's and mmdet's), the operator benchmark and ImageNet shift sets (sizes
unknown without their folders).
"""
from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass
from functools import cache

import yaml

from linvit.workflow.axes import NONE

DEFAULT_TFLOPS = 100.0
AXES = ("dataset", "teacher", "size", "operator", "init", "seed")


@dataclass
class Cost:
    job: object                  # linvit.workflow.jobs.Job
    train_flops: float
    eval_flops: float
    peak_bytes: float | None     # training jobs only

    @property
    def flops(self) -> float:
        return self.train_flops + self.eval_flops


def images(config: dict, data, split: str, subset: int | None, dataset_name: str) -> int:
    """A split's image count: the subset, else the dataset's own count, else plan.images."""
    from linvit.data import get_dataset
    from linvit.errors import ConfigError

    if subset:
        return subset
    n = get_dataset(data.dataset).split_size(data.root, split)
    n = n or ((config.get("plan") or {}).get("images") or {}).get(dataset_name, {}).get(split)
    if not n:
        raise ConfigError(f"plan.images.{dataset_name}.{split}: the {split} split's size is not "
                          f"known here (no folder at data.root); give it to cost the grid")
    return int(n)


def model_spec(cfg, size: str, operator: str, options: dict):
    """The spec of the model a job trains or scores, without its data on disk."""
    from linvit.data import get_dataset
    from linvit.errors import DataError
    from linvit.models import ModelSpec

    ds = get_dataset(cfg.data.dataset)
    try:
        info = ds.info(cfg.data.root, cfg.data.img_size)
        chans, classes = info.in_chans, info.num_classes
    except DataError:
        chans, classes = 3, 1000                   # a folder dataset not on this host: ImageNet's
    return ModelSpec(size, operator, classes, ds.image_size(cfg.data.img_size), chans,
                     dict(options or {}))


def parameters(spec) -> int:
    return _parameters(spec.size, spec.operator, tuple(sorted(spec.operator_options.items())),
                       spec.num_classes, spec.img_size, spec.in_chans)


@cache
def _parameters(size, operator, options, classes, img_size, chans) -> int:
    """Counted on the meta device (nothing allocated); once per distinct model of a grid."""
    import torch

    from linvit.models import ModelSpec, create_vit

    with torch.device("meta"):
        model = create_vit(ModelSpec(size, operator, classes, img_size, chans, dict(options)))
    return sum(p.numel() for p in model.parameters())


def activation_bytes(spec, batch: int) -> float:
    from linvit.models.flops import tokens

    size, n = spec.model_size, tokens(spec)
    per_block = 34.0 * n * size.width + (5.0 * size.heads * n * n if spec.operator == "softmax"
                                          else 0.0)
    return batch * size.depth * per_block


def _evals(cfg) -> int:
    """Test-set passes of a training job: one per eval_every epochs, and the final one."""
    every = cfg.run.eval_every
    return (cfg.optim.epochs // every if every else 0) + 1


def job_cost(config: dict, job, cfg) -> Cost | None:
    """The cost of one job from its stage's resolved config (None: a job not costed)."""
    from linvit.models.flops import forward_flops, train_flops_per_image

    name, stage, size = job.key.get("dataset"), job.stage, job.key.get("size")
    if stage in ("pretrain", "probe", "distill", "finetune"):
        student = (model_spec(cfg, size, "softmax", {}) if stage in ("pretrain", "probe")
                   else model_spec(cfg, size, cfg.model.operator, cfg.model.operator_options))
        teacher = model_spec(cfg, size, "softmax", {})
        seen = images(config, cfg.data, "train", cfg.data.train_subset, name) * cfg.optim.epochs
        per_image = (forward_flops(student) if stage == "probe" and cfg.mode == "linear"
                     else train_flops_per_image(student))
        if stage == "distill" or (stage == "finetune" and cfg.kd.weight > 0):
            per_image += forward_flops(teacher)               # the teacher's forward each step
        tested = images(config, cfg.data, "test", cfg.data.test_subset, name) * _evals(cfg)
        return Cost(job, per_image * seen, forward_flops(student) * tested,
                    peak_bytes(cfg, stage, student, teacher))
    if stage in ("select", "robustness", "attention-maps"):
        spec = model_spec(cfg, size, job.key.get("operator", "softmax"), {})
        scored = (cfg.images if stage == "attention-maps"
                  else images(config, cfg.data, "test", cfg.data.test_subset, name))
        if stage == "robustness" and cfg.corrupted:
            scored += corrupted_images(config)
        return Cost(job, 0.0, forward_flops(spec) * scored, None)
    return None


def corrupted_images(config: dict) -> int:
    """Images a robustness job scores on the corrupted copy: its clean subset and every set."""
    from linvit.robustness.config import CorruptionsCfg

    c = {**vars(CorruptionsCfg()), **((config.get("robustness") or {}).get("corruptions") or {})}
    return c["samples"] * (1 + len(c["names"]) * len(c["severities"]))


def peak_bytes(cfg, stage: str, student, teacher) -> float:
    """Weights, gradients and AdamW's moments of what trains, the frozen teacher's weights, and
    the batch's activations on one device (the assumptions of the module docstring)."""

    trained = parameters(student)
    frozen = parameters(teacher) if stage in ("distill", "finetune") else 0
    if stage == "probe" and cfg.mode == "linear":           # the head alone learns
        head = (student.model_size.width + 1) * student.num_classes
        trained, frozen = head, trained - head
    return 16.0 * trained + 4.0 * frozen + activation_bytes(student, cfg.data.batch_size)


# stages without a cost model (weights imported, scenes drawn, a set corrupted, the benchmark, a
# model exported: seconds of copying)
# and the dense tasks (TASKS), whose cost the plan leaves out
NOT_COSTED = ("import-teacher", "make-scenes", "corrupt", "bench", "choose", "export")


def not_costed(stage: str) -> bool:
    from linvit.dense.tasks import TASKS

    return stage in NOT_COSTED or stage in TASKS


def grid_costs(config: dict, stand_in: str) -> list[Cost]:
    """Every costed job of the grid, from its stage's config as its job will build it."""
    from linvit.cli import stage_config
    from linvit.config import load_config
    from linvit.workflow.plan import plan

    costs = []
    for job in plan(config).jobs:
        if not_costed(job.stage):
            continue
        cfg = load_config(stage_config(job.stage), None, job.words(stand_in))
        if (cost := job_cost(config, job, cfg)) is None:    # a new stage is costed or listed
            raise ValueError(f"stage {job.stage!r} ({job.kind.name} jobs) has no cost model: "
                             "cost it in linvit.workflow.cost.job_cost or list it in NOT_COSTED")
        costs.append(cost)
    return costs


def axis_value(job, axis: str) -> str:
    """A job's value on a grid axis (a teacher's operator is softmax and its init "teacher"; a
    distillation's init "(distillation)"; a config axis that does not reach it "none")."""
    defaults = {"operator": "softmax", "seed": "-",
                "init": "(distillation)" if job.kind.name == "distill" else "teacher"}
    value = job.key.get(axis, defaults.get(axis, "-" if axis in AXES else NONE))
    return "-" if value is None else str(value)


def tables(costs: list[Cost], tflops: float, axes=()) -> str:
    """Markdown: the cost per stage, per value of each grid axis (the built-in ones and the
    config's `axes`) with two or more values, and in all; device-hours at `tflops` effective
    TFLOP/s per device."""
    hours = lambda flops: flops / (tflops * 1e12) / 3600          # noqa: E731
    rows = ["| stage | jobs | training PFLOP | evaluation PFLOP | device-hours | "
            "peak memory per job (GiB) |", "|---|---:|---:|---:|---:|---:|"]
    for stage in dict.fromkeys(c.job.stage for c in costs):
        part = [c for c in costs if c.job.stage == stage]
        peaks = [c.peak_bytes for c in part if c.peak_bytes is not None]
        rows.append(f"| {stage} | {len(part)} | {sum(c.train_flops for c in part) / 1e15:.4g} | "
                    f"{sum(c.eval_flops for c in part) / 1e15:.4g} | "
                    f"{hours(sum(c.flops for c in part)):.4g} | "
                    f"{max(peaks) / 2**30:.3g} |" if peaks else
                    f"| {stage} | {len(part)} | 0 | {sum(c.eval_flops for c in part) / 1e15:.4g}"
                    f" | {hours(sum(c.flops for c in part)):.4g} | |")
    total = sum(c.flops for c in costs)
    rows.append(f"| **all** | {len(costs)} | {sum(c.train_flops for c in costs) / 1e15:.4g} | "
                f"{sum(c.eval_flops for c in costs) / 1e15:.4g} | **{hours(total):.4g}** | |")
    out = ["\n".join(rows)]
    for axis in (*AXES, *axes):
        values = list(dict.fromkeys(axis_value(c.job, axis) for c in costs))
        if len(values) < 2:
            continue
        lines = [f"| {axis} | device-hours | share |", "|---|---:|---:|"]
        for v in values:
            flops = sum(c.flops for c in costs if axis_value(c.job, axis) == v)
            lines.append(f"| {v} | {hours(flops):.4g} | {100 * flops / total:.1f}% |")
        out.append("\n".join(lines))
    return "\n\n".join(out)


def summary(costs: list[Cost], tflops: float) -> str:
    """One line: the costed jobs, their FLOPs and device-hours at `tflops` per device."""
    total = sum(c.flops for c in costs)
    return (f"{len(costs)} costed jobs, {total / 1e15:.4g} PFLOP: "
            f"{total / (tflops * 1e12) / 3600:.4g} device-hours at {tflops:g} effective TFLOP/s "
            "per device")


def plan_line(config: dict, config_name: str, stand_in: str, memo_dir=None) -> str:
    """The line a workflow start prints (the dry run included): what the grid costs, from
    `linvit plan`'s counts (`stand_in`: an existing file for the ones the grid will make), kept
    per config and code version in `memo_dir` (linvit.workflow.memo), so that a start with an
    unchanged grid does not import torch."""
    from linvit.workflow import memo

    tflops = (config.get("plan") or {}).get("tflops") or DEFAULT_TFLOPS
    key = memo.key_of({"config": config, "tflops": tflops, "environment": memo.environment()})
    found = memo.load(memo_dir, "plan_line", key) or {}
    line = found.get("line")
    if not isinstance(line, str):
        line = summary(grid_costs(config, stand_in), tflops)
        memo.store(memo_dir, "plan_line", key, {"line": line})
    return (f"linvit plan: {line}; not costed: dense tasks, the operator benchmark, shift sets "
            f"(`linvit plan --configfile {shlex.quote(config_name)}` for the table per stage and "
            "axis)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="linvit plan", description=__doc__.split("\n")[0])
    p.add_argument("--configfile", default="config/config.yaml", help="a workflow grid config")
    p.add_argument("--tflops", type=float, help="effective TFLOP/s of one device (default: the "
                   f"config's plan.tflops, else {DEFAULT_TFLOPS:g})")
    args = p.parse_args(argv)
    config = load_grid(args.configfile)
    tflops = args.tflops or (config.get("plan") or {}).get("tflops") or DEFAULT_TFLOPS
    costs = grid_costs(config, args.configfile)
    print(f"# What {args.configfile} costs\n")
    from linvit.workflow.grid import grid_axes

    print(tables(costs, tflops, grid_axes(config).names()))
    print(f"\nAssumed: {tflops:g} effective TFLOP/s per device (--tflops, plan.tflops); FLOPs "
          "and memory counted as linvit.workflow.cost states; not costed: dense tasks, the "
          "operator benchmark, ImageNet shift sets.")
    return 0


def load_grid(path: str) -> dict:
    """A workflow config as the Snakefile reads it: the schema's defaults, then the check."""
    from pathlib import Path

    from snakemake.utils import validate

    from linvit.workflow import check, schema

    config = yaml.safe_load(Path(path).read_text())
    validate(config, str(schema.PATH))
    check.check_config(config, path)
    return config


if __name__ == "__main__":
    sys.exit(main())
