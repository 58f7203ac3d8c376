"""Records -> tidy data frames (one row per job, per epoch, per distilled layer).

Every row carries its job's key and, in results.csv, the job's full resolved config (flattened to
`config.*` columns). A grid cell without a record appears with status "missing", never dropped.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from linvit.errors import ResultsError
from linvit.io import read_jsonl
from linvit.report.grid import KEY, Grid
from linvit.trees import flatten

METRICS = ["top1", "top5", "loss", "train_time_s", "epochs", "params", "eval_img_per_s",
           "train_img_per_s", "mIoU", "aAcc", "box_AP", "mask_AP", "step_s"]


def _flat(tree: dict, prefix: str) -> dict:
    """Dotted columns; mappings and lists kept as one JSON cell."""
    return {k: json.dumps(v) if isinstance(v, (dict, list)) else v
            for k, v in flatten(tree, prefix).items()}


def _key(record: dict) -> dict:
    return {"kind": record["kind"], **record["key"]}


def unique_keys(records: list[dict], key: list[str], what: str = "records") -> dict[tuple, dict]:
    """key values -> record, each key once: two records with one key are an error naming both
    (one would silently replace the other in every table)."""
    seen: dict[tuple, dict] = {}
    for r in records:
        values = tuple(_key(r).get(k) for k in key)
        if values in seen:
            raise ResultsError(f"two {what} with one key {dict(zip(key, values))}: "
                             f"{seen[values]['run_dir']} and {r['run_dir']}")
        seen[values] = r
    return seen


def results_frame(records: list[dict], grid: Grid | None = None,
                  expected: bool = True) -> pd.DataFrame:
    """One row per record; with `grid`, its key columns and (`expected`) a "missing" row per
    grid cell without a record."""
    key = _key_columns(grid)
    rows = []
    for r in records:
        row = {**_key(r), "status": r["status"], "error": r.get("error", ""),
               "run_dir": r["run_dir"]}
        m = r.get("metrics", {})
        row.update({("test_loss" if k == "loss" else k): m.get(k) for k in METRICS})
        row["init_top1"] = (m.get("init") or {}).get("top1")
        row["train_flops"] = ((m.get("train_images") or 0) * m["train_flops_per_image"]
                              if m.get("train_flops_per_image") else None)
        free = (m.get("quality") or {}).get("free") or {}
        row.update({f"free_{k}": free.get(k) for k in ("logit_kl", "agreement", "top1")})
        moved = m.get("attn_moved") or {}
        row["attn_moved"] = sum(moved.values()) / len(moved) if moved else None
        row.update(_flat(r.get("config", {}), "config."))
        rows.append(row)
    seen = unique_keys(records, key)
    for cell in grid.cells if grid is not None and expected else []:
        expected = {"kind": "cell", **cell}
        if tuple(expected.get(k) for k in key) not in seen:
            rows.append({**expected, "status": "missing",
                         "error": "no record: the job has not run"})
    frame = _integers_stay_integers(pd.DataFrame(rows), rows)
    for col in key + ["status"]:
        if col not in frame:
            frame[col] = None
    return frame[key + [c for c in frame.columns if c not in key]]


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


def curves_frame(records: list[dict], grid: Grid | None = None) -> pd.DataFrame:
    """Test accuracy against the student's training cost, per job: the init point, then each
    evaluated epoch, in images seen, FLOPs (linvit.models.flops) and seconds. A student built
    from a distilled model starts at its distillation's whole cost (its distillation: the one
    whose key the cell's key holds)."""
    distills = [r for r in records if r["kind"] == "distill"]
    unique_keys(distills, sorted({k for r in distills for k in r["key"]}), "distillations")
    distill_cost = {tuple(sorted(r["key"].items())): _cost(r)
                    for r in distills if r["status"] == "ok"}
    rows = []
    for r in records:
        if r["status"] != "ok" or r["kind"] in ("distill", "dense"):
            continue
        images, flops, seconds = next(
            (cost for key, cost in distill_cost.items()
             if all(r["key"].get(name) == value for name, value in key)), (0, 0, 0))
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
    return pd.DataFrame(rows, columns=_key_columns(grid) + CURVE)


LAYER_COLUMNS = ["phase", "epoch", "metric", "layer", "value"]


def _layer_rows(base: dict, values: dict, prefix: str, phase: str, epoch) -> list[dict]:
    """One row per `<prefix><metric>/L<layer>` entry of `values`."""
    rows = []
    for name, value in values.items():
        if name.startswith(prefix) and "/L" in name:
            metric, layer = name[len(prefix):].rsplit("/L", 1)
            rows.append({**base, "phase": phase, "epoch": epoch, "metric": metric,
                         "layer": int(layer), "value": value})
    return rows


def distill_frame(records: list[dict], grid: Grid | None = None) -> pd.DataFrame:
    """Teacher-forced per-layer quantities of each distillation (linvit.transfer.quality), by
    phase: "before" its first step, "epoch" after each evaluated epoch (train.jsonl), "end", and
    the references in its operator, "random" and "copied" attention."""
    rows = []
    for r in records:
        if r["kind"] != "distill" or r["status"] != "ok":
            continue
        m, base = r["metrics"], _key(r)
        quality = m.get("quality") or {}
        rows += _layer_rows(base, quality.get("before") or {}, "tf_", "before", 0)
        log = Path(r["run_dir"]) / "train.jsonl"
        for epoch in read_jsonl(log) if log.is_file() else []:
            rows += _layer_rows(base, epoch, "test_tf_", "epoch", epoch["epoch"])
        rows += _layer_rows(base, m, "tf_", "end", m.get("epochs"))
        for reference in ("random", "copied"):
            rows += _layer_rows(base, quality.get(reference) or {}, "tf_", reference, None)
    frame = pd.DataFrame(rows, columns=_key_columns(grid) + LAYER_COLUMNS)
    frame["epoch"] = frame["epoch"].astype("Int64")
    return frame


def _key_columns(grid: Grid | None) -> list[str]:
    return grid.key if grid is not None else KEY


def collect(records: list[dict], grid: Grid | None, out_dir: str | Path,
            expected: bool = True) -> dict[str, Path]:
    from linvit.io import write_text
    from linvit.report.paths import COLLECTED

    out_dir = Path(out_dir)
    frames = dict(zip(COLLECTED, (results_frame(records, grid, expected),
                                  curves_frame(records, grid), distill_frame(records, grid)),
                      strict=True))
    paths = {}
    for name, frame in frames.items():
        paths[name] = out_dir / f"{name}.csv"
        write_text(paths[name], frame.to_csv(index=False))
    return paths


def run_step(a) -> None:
    from linvit.report.grid import read_grid
    from linvit.report.record import read_records

    collect(read_records(a.records), read_grid(a.grid) if a.grid else None, a.out,
            expected=not a.key_only)
