"""After a SLURM run that failed or was interrupted: cancel the jobs it submitted that still run.

On Ctrl-C, Snakemake cancels the jobs in its executor's list at that instant, and the remote
executor (snakemake-interface-executor-plugins) takes every job out of that list while it checks
their status, putting them back after: a Ctrl-C during a check cancels none of them, and they go
on running with no Snakemake waiting for them (CI saw a frozen training job keep its allocation).
The run's own log names each job it submitted; the workflow's `onerror` hook cancels those that
`squeue` still lists with the run's working directory (the plugin submits with `-D <workdir>`; a
job id alone could name another cluster's job where a run submits to several), and no other job.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

# The plugin's line for each submission (snakemake-executor-plugin-slurm 2.x).
SUBMITTED = re.compile(r"has been submitted with SLURM jobid (\d+)")


def submitted_jobs(log_text: str) -> list[str]:
    """The SLURM job ids a Snakemake log says were submitted, in order, each once."""
    return list(dict.fromkeys(SUBMITTED.findall(log_text)))


def queued_jobs() -> dict[str, str] | None:
    """This user's pending or running jobs, id -> working directory; None where squeue cannot
    answer."""
    try:
        run = subprocess.run(["squeue", "-h", "-o", "%i %Z", "-u", str(os.getuid())],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if run.returncode != 0:
        return None
    return dict(line.split(" ", 1) for line in run.stdout.splitlines() if " " in line)


def cancel_leftovers(logs, workdir: str | os.PathLike) -> list[str]:
    """Cancel the jobs the run's Snakemake logs (`log` in an onerror hook: a list of paths, or
    one path) say were submitted that squeue still lists in `workdir` (where the plugin
    submitted them); their ids (a refused scancel is printed with them). Does nothing for a
    run that submitted nothing to SLURM."""
    paths = [Path(p) for p in ([logs] if isinstance(logs, (str, os.PathLike)) else logs or [])]
    ids = submitted_jobs("".join(p.read_text(errors="replace") for p in paths if p.is_file()))
    if not ids:
        return []
    queued = queued_jobs()
    if queued is None:
        print(f"linvit: squeue did not answer; this run submitted SLURM jobs {' '.join(ids)}: "
              "cancel any of them that `squeue --me` still lists", file=sys.stderr)
        return []
    here = Path(workdir).resolve()
    left = [job for job in ids if job in queued and Path(queued[job]).resolve() == here]
    if left:
        try:
            run = subprocess.run(["scancel", *left], capture_output=True, text=True, timeout=60)
            failed = run.stderr.strip() if run.returncode else ""
        except (OSError, subprocess.TimeoutExpired) as e:
            failed = str(e)
        done = f"scancel failed ({failed}) for" if failed else "cancelled"
        print(f"linvit: {done} SLURM jobs this run left running: {' '.join(left)}",
              file=sys.stderr)
    return left
