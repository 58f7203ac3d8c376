"""Job records: what a workflow job leaves for collection, whether the job succeeded or not.

Every workflow job ends with a record.json (status "ok" with the run's metrics and resolved
config, or "failed" with the end of its log), so one failing cell shows up as failed in the
tables instead of stopping everything downstream. Records hold no tensors and read only JSON/YAML.
"""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from linvit.io import write_json

LOG_TAIL_LINES = 30


def make_record(kind: str, key: dict, run_dir: str | Path, exit_status: int,
                log: str | Path | None = None) -> dict:
    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.json"
    record = {"kind": kind, "key": key, "run_dir": str(run_dir), "exit_status": exit_status}
    if exit_status == 0 and metrics.is_file():
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        record.update(status="ok", metrics=json.loads(metrics.read_text()),
                      config=config.get("config", {}))
    else:
        tail = []
        if log is not None and Path(log).is_file():
            tail = Path(log).read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        reason = next((line for line in reversed(tail) if "error" in line.lower()),
                      tail[-1] if tail else f"exit status {exit_status}, no log")
        record.update(status="failed", error=reason.strip(), log_tail=tail)
    return record


def write_record(out: str | Path, **kwargs) -> dict:
    record = make_record(**kwargs)
    write_json(out, record)
    return record


def read_records(paths) -> list[dict]:
    return [json.loads(Path(p).read_text()) for p in paths]


def run_step(a) -> None:
    write_record(a.out, kind=a.kind, key=json.loads(a.key), run_dir=a.run_dir,
                 exit_status=a.status, log=a.log)
