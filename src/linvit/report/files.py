"""Reading the workflow's result files (shared by the report steps)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd


def read_csv(path: str | Path, grid=None) -> pd.DataFrame:
    """A results file; the seed column as nullable integers (blank where a job has none), and
    the config axes of `grid` (linvit.report.grid.Grid) as text: their values are labels, which
    pandas would read as numbers ("5", "0.001")."""
    text = {name: str for name in (grid.axis_names if grid is not None else [])}
    frame = pd.read_csv(path, dtype=text)
    if "seed" in frame:
        frame["seed"] = frame["seed"].astype("Int64")
    return frame
