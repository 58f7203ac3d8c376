"""What grids have spent so far, from Snakemake's per-job benchmark files: `linvit plan` says what a
grid will cost; this says what its jobs measured (CPU-seconds and wall time), each job counted
once however many of the grids share it (a `jobs_folder` of theirs), by grid and job kind.

    python -m linvit.workflow.spent --configfile config/study.yaml \\
        --configfile config/study-distill.yaml --cores 2

A job is counted by the grid listed first that plans it; a planned job without a benchmark file
has not run (or ran without one: imports, choices, scenes) and is counted as such.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from linvit.workflow.plan import plan


def read_benchmark(path: Path) -> tuple[float, float] | None:
    """(cpu_time, wall seconds) of a Snakemake benchmark file's last repeat; None if absent."""
    if not path.is_file():
        return None
    rows = list(csv.DictReader(path.read_text().splitlines(), delimiter="\t"))
    if not rows:
        return None
    return float(rows[-1]["cpu_time"]), float(rows[-1]["s"])


def spent(grids: dict[str, dict]) -> list[dict]:
    """One row per (grid, job kind): jobs planned, jobs measured, CPU-s and wall-s; jobs that
    several grids share counted once, under the first grid (in the order given)."""
    seen: set[str] = set()
    rows: dict[tuple, dict] = {}
    for name, config in grids.items():
        for job in plan(config).jobs:
            path = job.benchmark
            if path is None or path in seen:
                continue
            seen.add(path)
            row = rows.setdefault((name, job.kind.name), {
                "grid": name, "kind": job.kind.name, "jobs": 0, "measured": 0, "cpu_s": 0.0,
                "wall_s": 0.0})
            row["jobs"] += 1
            if (measured := read_benchmark(Path(path))) is not None:
                row["measured"] += 1
                row["cpu_s"] += measured[0]
                row["wall_s"] += measured[1]
    return list(rows.values())


def markdown(rows: list[dict], cores: int) -> str:
    lines = ["| grid | job kind | jobs measured / planned | CPU-seconds | wall seconds |",
             "|---|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['grid']} | {r['kind']} | {r['measured']} / {r['jobs']} | "
                     f"{r['cpu_s']:,.0f} | {r['wall_s']:,.0f} |")
    cpu, done, jobs = (sum(r[k] for r in rows) for k in ("cpu_s", "measured", "jobs"))
    hours, minutes = divmod(round(cpu / cores / 60), 60)
    lines.append(f"| **all** | | **{done} / {jobs}** | **{cpu:,.0f}** | |")
    lines.append(f"\n{cpu:,.0f} CPU-seconds: {hours} h {minutes:02d} min of {cores} busy cores "
                 f"({jobs - done} planned job(s) not measured yet).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m linvit.workflow.spent",
                                description=__doc__.split("\n")[0])
    p.add_argument("--configfile", action="append", required=True,
                   help="a grid config (repeat for grids that share a jobs folder)")
    p.add_argument("--cores", type=int, default=2, help="the machine's cores, for the hours")
    args = p.parse_args(argv)
    from linvit.workflow.cost import load_grid

    grids = {Path(f).stem: load_grid(f) for f in args.configfile}
    print(markdown(spent(grids), args.cores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
