"""Reading the workflow's result files (shared by the report steps)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

GRID_KEYS = ("cells", "main_loss", "orders", "tables")


def read_grid(path: str | Path) -> dict:
    """grid.json: the expected cells, the axis orders, the main loss design and the report's
    tables."""
    doc = json.loads(Path(path).read_text())
    lacking = [k for k in GRID_KEYS if k not in doc]
    if lacking:
        raise ValueError(f"{path}: no {', '.join(lacking)} (written by an older linvit): rerun "
                         "the workflow, which rewrites it")
    return doc


def read_csv(path: str | Path) -> pd.DataFrame:
    """A results file; the seed column as nullable integers (blank where a job has none)."""
    frame = pd.read_csv(path)
    if "seed" in frame:
        frame["seed"] = frame["seed"].astype("Int64")
    return frame
