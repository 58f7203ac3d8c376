"""Records -> tidy data frames (one row per job, per epoch, per distilled layer).

Every row carries its job's key and, in results.csv, the job's full resolved config (flattened to
`config.*` columns). A grid cell without a record appears with status "missing", never dropped.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from linvit.io import read_jsonl
from linvit.trees import flatten

KEY = ["kind", "task", "dataset", "teacher", "size", "operator", "init", "loss", "seed"]
GROUP = ["dataset", "teacher", "size"]           # the key of one teacher model and its cells
METRICS = ["top1", "top5", "loss", "train_time_s", "epochs", "params", "eval_img_per_s",
           "train_img_per_s", "mIoU", "aAcc", "box_AP", "mask_AP", "step_s"]


def _flat(tree: dict, prefix: str) -> dict:
    """Dotted columns; mappings and lists kept as one JSON cell."""
    return {k: json.dumps(v) if isinstance(v, (dict, list)) else v
            for k, v in flatten(tree, prefix).items()}


def _key(record: dict) -> dict:
    return {"kind": record["kind"], **record["key"]}


def results_frame(records: list[dict], grid: list[dict] | None = None) -> pd.DataFrame:
    rows = []
    for r in records:
        row = {**_key(r), "status": r["status"], "error": r.get("error", ""),
               "run_dir": r["run_dir"]}
        m = r.get("metrics", {})
        row.update({("test_loss" if k == "loss" else k): m.get(k) for k in METRICS})
        row["init_top1"] = (m.get("init") or {}).get("top1")
        row.update(_flat(r.get("config", {}), "config."))
        rows.append(row)
    seen = {tuple(_key(r).get(k) for k in KEY) for r in records}
    for cell in grid or []:
        key = {"kind": "cell", **cell}
        if tuple(key.get(k) for k in KEY) not in seen:
            rows.append({**key, "status": "missing", "error": "no record: the job has not run"})
    frame = _integers_stay_integers(pd.DataFrame(rows), rows)
    for col in KEY + ["status"]:
        if col not in frame:
            frame[col] = None
    return frame[KEY + [c for c in frame.columns if c not in KEY]]


def _integers_stay_integers(frame: pd.DataFrame, rows: list[dict]) -> pd.DataFrame:
    """Columns of integers with gaps (teachers have no seed) as nullable integers: pandas would
    make them floats, and results.csv would say seed 1.0 and params 684298.0."""
    for col in frame.columns:
        values = [row[col] for row in rows if row.get(col) is not None]
        if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            frame[col] = frame[col].astype("Int64")
    return frame


CURVE = ["epoch", "images", "flops", "compute_s", "test_top1"]


def _cost(record: dict) -> tuple[float, float, float]:
    """A finished job's whole training cost: images seen, FLOPs and seconds (0 where a record
    made before linvit counted images has none)."""
    m = record["metrics"]
    images = m.get("train_images") or 0
    return images, images * (m.get("train_flops_per_image") or 0.0), m["train_time_s"]


def curves_frame(records: list[dict]) -> pd.DataFrame:
    """Test accuracy against the student's training cost, per job: the init point, then each
    evaluated epoch, in images seen, FLOPs (linvit.models.flops) and seconds. A student built
    from a distilled model starts at its distillation's whole cost."""
    job = ("dataset", "teacher", "size", "operator", "loss")          # a distillation's key
    distill_cost = {tuple(r["key"].get(k) for k in job): _cost(r)
                    for r in records if r["kind"] == "distill" and r["status"] == "ok"}
    rows = []
    for r in records:
        if r["status"] != "ok" or r["kind"] in ("distill", "dense"):
            continue
        k = r["key"]
        images, flops, seconds = distill_cost.get(tuple(k.get(name) for name in job), (0, 0, 0))
        per_image = r["metrics"].get("train_flops_per_image") or float("nan")
        base = {**_key(r)}
        init = r["metrics"].get("init")
        if init:
            rows.append({**base, "epoch": 0, "images": images, "flops": flops,
                         "compute_s": seconds, "test_top1": init["top1"]})
        log = Path(r["run_dir"]) / "train.jsonl"
        for epoch in read_jsonl(log) if log.is_file() else []:
            seen = epoch.get("train_images", float("nan"))
            images, flops = images + seen, flops + seen * per_image
            seconds += epoch["train_time_s"]
            if "test_top1" in epoch:
                rows.append({**base, "epoch": epoch["epoch"], "images": images, "flops": flops,
                             "compute_s": seconds, "test_top1": epoch["test_top1"]})
    return pd.DataFrame(rows, columns=KEY + CURVE)


def distill_frame(records: list[dict]) -> pd.DataFrame:
    """Teacher-forced per-layer quantities of each distillation (tf_<name>/L<layer>)."""
    rows = []
    for r in records:
        if r["kind"] != "distill" or r["status"] != "ok":
            continue
        for name, value in r["metrics"].items():
            if name.startswith("tf_") and "/L" in name:
                metric, layer = name[3:].rsplit("/L", 1)
                rows.append({**_key(r), "metric": metric, "layer": int(layer), "value": value})
    return pd.DataFrame(rows, columns=KEY + ["metric", "layer", "value"])


def collect(records: list[dict], grid: list[dict], out_dir: str | Path) -> dict[str, Path]:
    from linvit.io import write_text
    from linvit.report.paths import COLLECTED

    out_dir = Path(out_dir)
    frames = dict(zip(COLLECTED, (results_frame(records, grid), curves_frame(records),
                                  distill_frame(records)), strict=True))
    paths = {}
    for name, frame in frames.items():
        paths[name] = out_dir / f"{name}.csv"
        write_text(paths[name], frame.to_csv(index=False))
    return paths


def run_step(a) -> None:
    from linvit.report.files import read_grid
    from linvit.report.record import read_records

    collect(read_records(a.records), read_grid(a.grid)["cells"] if a.grid else [], a.out)
