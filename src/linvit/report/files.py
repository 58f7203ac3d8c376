"""Reading the workflow's result files (shared by the report steps)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd


def read_grid(path: str | Path) -> dict:
    """grid.json: the expected cells, the axis orders and the main loss design."""
    return json.loads(Path(path).read_text())


def read_csv(path: str | Path) -> pd.DataFrame:
    """A results file; the seed column as nullable integers (blank where a job has none)."""
    frame = pd.read_csv(path)
    if "seed" in frame:
        frame["seed"] = frame["seed"].astype("Int64")
    return frame
