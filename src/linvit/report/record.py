"""Job records: what a workflow job leaves for collection, whether the job succeeded or not.

Every workflow job ends with a record.json (status "ok" with the run's metrics and resolved
config, or "failed" with the end of its log), so one failing cell shows up as failed in the
tables instead of stopping everything downstream. Records hold no tensors and read only JSON/YAML.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from linvit.io import loads, read_json, write_json
from linvit.report.kinds import KINDS
from linvit.runs.verify import check_run

LOG_TAIL_LINES = 30


def make_record(kind: str, key: dict, run_dir: str | Path, exit_status: int,
                log: str | Path | None = None, made_by: dict | None = None) -> dict:
    """"ok" only for a run that exited 0 and whose outputs verify (linvit.runs.rundir).
    `made_by`: the grid and command that made it (linvit.workflow.shared)."""
    if kind not in KINDS:
        raise ValueError(f"record kind {kind!r} is not one of: {', '.join(KINDS)}")
    run_dir = Path(run_dir)
    record = {"kind": kind, "key": key, "run_dir": str(run_dir), "exit_status": exit_status,
              **({"made_by": made_by} if made_by else {})}
    metrics, why = check_run(run_dir) if exit_status == 0 else (None, "")
    if metrics is not None:
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        record.update(status="ok", metrics=metrics, config=config.get("config", {}))
        return record
    tail = []
    if log is not None and Path(log).is_file():
        tail = Path(log).read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    reason = next((line for line in reversed(tail) if "error" in line.lower()
                   or "failed" in line.lower()),
                  tail[-1] if tail else f"exit status {exit_status}, no log")
    if exit_status == 0:
        reason = f"exit status 0 but the run does not verify ({run_dir}: {why}); {reason}"
    record.update(status="failed", error=reason.strip(), log_tail=tail)
    return record


def made_by(grid: str, digest: str) -> dict:
    """A record's `made_by`: the results folder of the grid that ran the job, and the digest of
    its command (linvit.workflow.shared)."""
    return {"grid": grid, "command": digest}


def write_record(out: str | Path, **kwargs) -> dict:
    record = make_record(**kwargs)
    write_json(out, record)
    return record


def read_records(paths) -> list[dict]:
    return [read_json(p) for p in paths]


def run_step(a) -> None:
    write_record(a.out, kind=a.kind, key=loads(a.key), run_dir=a.run_dir,
                 exit_status=a.status, log=a.log,
                 made_by=made_by(a.grid_results, a.command_digest) if a.grid_results else None)
