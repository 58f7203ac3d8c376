"""Reading the workflow's result files (shared by the report steps)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd


def read_grid(path: str | Path) -> dict:
    """grid.json: the expected cells, the axis orders and the main loss design."""
    return json.loads(Path(path).read_text())


def read_csv(path: str | Path) -> pd.DataFrame:
    return pd.read_csv(path)
