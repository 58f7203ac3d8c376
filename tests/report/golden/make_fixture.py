"""Write tests/report/golden/fixture/, a small results folder as the workflow leaves it.

Nothing is trained. Usage:

    python tests/report/golden/make_fixture.py [--out FOLDER]   (default: tests/report/golden)

The folder mirrors the workflow's `results/` (a name git ignores, hence `fixture/`): grid.json,
run folders (teachers/, distill/, cells/) holding what collection reads (config.yaml, train.jsonl,
metrics.json with the SHA-256 of every declared output, as linvit.runs.rundir.RunDir.finish
writes it) and each job's record.json, written by linvit.report.record.make_record from the run
folder, as the workflow's `record` step does. jobs.json lists the jobs in the workflow's order
(teachers, distillations, cells) with the arguments of their `record` step; paths are relative
to the folder that holds `fixture/`, so the test runs from a copy anywhere.

What the grid shows: a teacher row; two seeds of one cell (a CI); a cell with one seed ok and one
failed (its outputs changed after metrics.json: exit status 0, but they do not verify); a cell
with one seed and one missing; a cell with no record at all (missing); a failed distillation and
its failed student (failed, in the loss-design table).

The output is a pure function of this file: test_report_golden.py regenerates it and compares.
After changing it, run it, then regenerate the expected outputs (see test_report_golden.py).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import struct
import zlib
from pathlib import Path

from linvit.io import sha256_file, write_json, write_text, write_yaml
from linvit.report.record import write_record
from linvit.runs.rundir import MARKER, owned_names
from linvit.stages import STAGES
from linvit.workflow.grid import Cell, expand_grid, grid_document
from linvit.workflow.jobs import KINDS

HERE = Path(__file__).resolve().parent
RESULTS = "fixture"                  # the results folder, relative to the folder holding it
ENV = {"cuda": False, "platform": "golden-fixture", "python": "3.11", "timm": "1.0",
       "torch": "2.14"}
PLACEHOLDER = b"golden fixture: no weights\n"   # model files are checksummed, never loaded

CONFIG = {
    "datasets": {"fashion_mnist": {"dataset": "fashion_mnist"}},
    "sizes": ["cpu96"],
    "operators": ["linear"],
    "strategies": ["random", "copy_embed", "copy_mlp", "copy_mlp+distill"],
    "reference_strategies": ["copy_all"],
    "seeds": [0, 1],
    "losses": {"out": {"attn_out_mse": 1.0}, "map": {"attn_map_ce": 1.0}},
    "main_loss": "out",
    "loss_grid": {"operators": ["linear"], "strategies": ["copy_mlp+distill"], "losses": ["map"]},
}

# cell (operator, init, loss, seed) -> final top-1, init top-1, or a failure
CELLS = {
    ("linear", "random", "none", 0): (34.12, 10.0),
    ("linear", "random", "none", 1): (35.87, 9.8),
    ("linear", "copy_mlp", "none", 0): (52.14, 11.3),
    ("linear", "copy_mlp", "none", 1): "changed",      # exit 0, an output changed afterwards
    ("linear", "copy_mlp+distill", "out", 0): (73.91, 61.2),
    ("linear", "copy_mlp+distill", "out", 1): (74.05, 60.4),
    ("softmax", "copy_all", "none", 0): (76.3, 76.8),
    ("softmax", "copy_all", "none", 1): (76.6, 76.8),
    ("linear", "copy_mlp+distill", "map", 0): "error",  # its distillation failed
}
DISTILLS = {"out": 40.79, "map": "error"}


def path(kind: str, part: str, **wildcards) -> str:
    """A job's folder or log, from the workflow's own templates (linvit.workflow.jobs)."""
    template = getattr(KINDS[kind], part)
    return f"{RESULTS}/{template.format(**wildcards)}"


def png(width: int = 1, height: int = 1) -> bytes:
    """A grey PNG (the report links figures; it never reads them)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))
    rows = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)       # 8-bit grey
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 9))
            + chunk(b"IEND", b""))


def start_run(run_dir: Path, stage: str, config: dict) -> None:
    """What RunDir.open leaves: the marker and the resolved config."""
    run_dir.mkdir(parents=True)
    write_json(run_dir / MARKER, {"linvit": "run folder", "stage": stage,
                                  "files": owned_names(stage)})
    write_yaml(run_dir / "config.yaml", {"stage": stage, "config": config})


def finish_run(run_dir: Path, stage: str, metrics: dict, extra: dict) -> None:
    """The declared outputs, then metrics.json with their SHA-256, as RunDir.finish writes it."""
    for name in STAGES[stage].outputs:
        target = run_dir / name
        if name in extra:
            write_text(target, extra[name])
        elif not target.exists():
            target.write_bytes(PLACEHOLDER)
    outputs = {name: sha256_file(run_dir / name) for name in STAGES[stage].outputs}
    write_json(run_dir / "metrics.json", {**metrics, "stage": stage, "env": ENV,
                                          "outputs": outputs})


def tf_layers(scale: float) -> dict:
    """Teacher-forced per-layer numbers of a distillation (linvit.transfer.quality): its loss,
    the relative attention-output error, the map KL, growing with depth."""
    return {f"tf_{m}/L{i}": round(scale * factor * (i + 1), 4)
            for m, factor in (("attn_out_mse", 0.5), ("rel_err", 1.0), ("map_kl", 2.0))
            for i in range(6)}


def epochs(top1: float, init: float, n: int, seconds: float, images: int,
           evaluation: dict | None = None) -> str:
    lines = []
    for e in range(1, n + 1):
        acc = round(init + (top1 - init) * e / n, 2)
        lines.append(json.dumps({"epoch": e, "lr": 0.001, "test_top1": acc,
                                 "train_images": images, "train_loss": round(2.3 - acc / 50, 4),
                                 "train_time_s": seconds,
                                 **{f"test_{k}": v for k, v in (evaluation or {}).items()}},
                                sort_keys=True))
    return "\n".join(lines) + "\n"


def failed_log(job: str, reason: str) -> str:
    return (f"INFO {job} run in {RESULTS}/...\nINFO epoch 1/2\n"
            "Traceback (most recent call last):\n  File \"linvit/cli.py\", line 1, in main\n"
            f"linvit: error: {reason}\nINFO the last checkpoint stays for a resume\n")


def teacher_job(root: Path, jobs: list) -> None:
    run_dir = path("teacher", "folder", dataset="fashion_mnist", teacher="pretrain", size="cpu96")
    config = {"data": {"dataset": "fashion_mnist", "batch_size": 64},
              "model": {"size": "cpu96", "operator": "softmax"},
              "optim": {"epochs": 2, "lr": 0.002}, "run": {"seed": 0}}
    start_run(root / run_dir, "pretrain", config)
    finish_run(root / run_dir, "pretrain",
               {"top1": 76.8, "top5": 99.1, "loss": 0.61, "epochs": 2, "params": 684298,
                "train_time_s": 250.0, "eval_img_per_s": 1200.0, "train_img_per_s": 450.0,
                "train_images": 120000, "train_flops_per_image": 4.2e7},
               {"train.jsonl": epochs(76.8, 10.0, 2, 125.0, 60000)})
    jobs.append({"kind": "teacher", "key": {"dataset": "fashion_mnist", "teacher": "pretrain",
                                            "size": "cpu96", "stage": "pretrain"},
                 "run_dir": run_dir, "status": 0, "log": None})


def distill_job(root: Path, jobs: list, loss: str, result) -> None:
    where = dict(dataset="fashion_mnist", teacher="pretrain", size="cpu96", operator="linear",
                 loss=loss)
    run_dir = path("distill", "folder", **where)
    config = {"data": {"dataset": "fashion_mnist", "train_subset": 30000},
              "model": {"operator": "linear"}, "distill": {"losses": CONFIG["losses"][loss]},
              "optim": {"epochs": 1, "lr": 0.001}, "run": {"seed": 0}}
    start_run(root / run_dir, "distill", config)
    job = {"kind": "distill", "key": {"dataset": "fashion_mnist", "loss": loss,
                                      "operator": "linear", "teacher": "pretrain",
                                      "size": "cpu96"},
           "run_dir": run_dir, "status": 0, "log": None}
    if result == "error":
        job["log"] = path("distill", "log", **where)
        write_text(root / job["log"], failed_log("distill", "non-finite loss at step 3"))
        job["status"] = 1
    else:
        finish_run(root / run_dir, "distill",
                   {"top1": result, "loss": 1.36, "epochs": 1, "train_time_s": 90.0,
                    "init": {"top1": 10.0}, "train_images": 30000,
                    "train_flops_per_image": 6.1e7, **tf_layers(0.1),
                    "quality": {"before": tf_layers(0.8), "random": tf_layers(0.8),
                                "copied": tf_layers(0.4),
                                "free": {"logit_kl": 0.52, "agreement": 61.5, "top1": 55.25}}},
                   {"train.jsonl": epochs(result, 10.0, 1, 90.0, 30000, tf_layers(0.1))})
    jobs.append(job)


def cell_job(root: Path, jobs: list, operator: str, init: str, loss: str, seed: int,
             result) -> None:
    cell = Cell("fashion_mnist", "pretrain", "cpu96", operator, init, loss, seed)
    run_dir = path("cell", "folder", **cell.as_dict())
    config = {"data": {"dataset": "fashion_mnist", "train_subset": 10000},
              "model": {"operator": operator}, "init": {"strategy": init},
              "optim": {"epochs": 2, "lr": 0.001}, "run": {"seed": seed}}
    start_run(root / run_dir, "finetune", config)
    job = {"kind": "cell", "key": cell.as_dict(), "run_dir": run_dir, "status": 0, "log": None}
    log = path("cell", "log", **cell.as_dict())
    if result == "error":
        write_text(root / log, failed_log("finetune", "distilled model not found"))
        job.update(status=1, log=log)
    else:
        top1, init_top1 = (52.0, 11.0) if result == "changed" else result
        finish_run(root / run_dir, "finetune",
                   {"top1": top1, "top5": 98.0, "loss": 0.8, "epochs": 2, "params": 684298,
                    "train_time_s": 60.0, "eval_img_per_s": 500.0, "train_img_per_s": 160.0,
                    "init": {"top1": init_top1}, "strategy": init, "train_images": 20000,
                    "train_flops_per_image": 4.0e7,
                    **({"attn_moved": {f"L{i}": 0.05 * (i + 1) for i in range(6)}}
                       if "distill" in init else {})},
                   {"train.jsonl": epochs(top1, init_top1, 2, 30.0, 10000),
                    "copied.json": json.dumps({"strategy": init}) + "\n"})
        if result == "changed":
            write_text(root / run_dir / "train.jsonl", "")
            write_text(root / log, "INFO finetune run\nINFO finished\n")
            job["log"] = log
    jobs.append(job)


def make(root: Path) -> None:
    """Write root/fixture/ (which must not exist). Records are written from inside `root`, with
    relative paths, as the workflow writes them from the project folder."""
    out = root / RESULTS
    out.mkdir(parents=True)
    cells = expand_grid(CONFIG)
    write_text(out / "grid.json", json.dumps(grid_document(CONFIG, cells), sort_keys=True,
                                             indent=1))
    jobs: list[dict] = []
    teacher_job(root, jobs)
    for loss, result in DISTILLS.items():
        distill_job(root, jobs, loss, result)
    for c in cells:
        result = CELLS.get((c.operator, c.init, c.loss, c.seed))
        if result is not None:                # not in CELLS: a job that has not run
            cell_job(root, jobs, c.operator, c.init, c.loss, c.seed, result)
    with contextlib.chdir(root):
        for job in jobs:
            job["out"] = f"{job['run_dir']}/record.json"
            write_record(job["out"], kind=job["kind"], key=job["key"], run_dir=job["run_dir"],
                         exit_status=job["status"], log=job["log"])
    write_text(out / "jobs.json", json.dumps(jobs, indent=1) + "\n")
    (out / "figures").mkdir()
    for name in ("accuracy_by_init", "attention_maps", "claims"):
        (out / "figures" / f"{name}.png").write_bytes(png())


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=HERE,
                   help="the folder to hold fixture/ (default: tests/report/golden); its "
                        "fixture/ is replaced")
    root = p.parse_args(argv).out.resolve()
    if (root / RESULTS).exists():
        shutil.rmtree(root / RESULTS)
    make(root)


if __name__ == "__main__":
    main()
