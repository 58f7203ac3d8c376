"""Jobs shared between grids: a grid's `jobs_folder` (default: its results folder) keeps its
teachers, distillations, cells and selection candidates (the `shared` job kinds); grids that
name one folder compute the jobs they have in common once, as Snakemake sees the same outputs.
A study of several grids then trains its teacher once, not once per grid.

Each such job's record says which grid made it and with which command (`made_by`). Sharing is
safe only where the commands agree: a job in the folder that another grid made with another
command (other settings under the same folder names) stops the plan with both grids named, before
anything runs, instead of being silently rerun over the other grid's result. A grid's own jobs
(made by its results folder) rerun as usual when its settings change.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from linvit.errors import ConfigError


def digest(command: str) -> str:
    """What identifies a job's work: its stage, run folder and every override (Job.command)."""
    return hashlib.sha256(command.encode()).hexdigest()[:16]


def same_folder(a: str, b: str) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)


def check_not_foreign(plan) -> None:
    """Refuse a shared job whose record another grid wrote with another command (in this grid's
    jobs folder, be it its results folder: another grid may name that as its jobs folder)."""
    for job in plan.jobs:
        if not job.kind.shared:
            continue
        record = Path(job.output)
        if not record.is_file() or job.kind.record_kind is None:
            continue
        try:
            maker = json.loads(record.read_text()).get("made_by") or {}
        except (OSError, ValueError):
            continue           # a torn record: Snakemake reruns the job, as for its own
        if maker.get("grid") is None or same_folder(maker["grid"], plan.results):
            continue
        if maker.get("command") != digest(job.command()):
            raise ConfigError(
                f"jobs_folder: {job.folder} was made by the grid of {maker['grid']!r} with other "
                f"settings than this grid ({plan.results!r}) gives it: running it here would "
                "replace that grid's result. Make the two grids' settings for it agree, or give "
                "this grid a jobs_folder of its own")
