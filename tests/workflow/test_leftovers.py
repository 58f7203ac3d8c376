"""linvit.workflow.leftovers: after a failed or interrupted SLURM run, the jobs its log names
that squeue still lists are cancelled, and no other job. Here with stand-in `squeue`/`scancel`
programs; on a real cluster: tests/workflow/test_slurm.py."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from linvit.workflow.leftovers import cancel_leftovers, submitted_jobs

LOG = """Job 3 has been submitted with SLURM jobid 11 (log: a/11.log).
Job 4 has been submitted with SLURM jobid 12 (log: a/12.log).
Job 4 has been submitted with SLURM jobid 12 (log: a/12.log).
Job 5 has been submitted with SLURM jobid 14 (log: a/14.log).
Terminating processes on user request, this might take some time.
"""


@pytest.fixture
def slurm_clients(tmp_path, monkeypatch):
    """squeue listing `queue` (or failing when it is None), scancel recording its arguments."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    cancelled = tmp_path / "scancel.args"

    def install(queue: list[str] | None, refuse: bool = False, workdir: Path = tmp_path):
        """`queue`: job ids listed in `workdir` (an id "N@folder": in that folder)."""
        lines = [j.replace("@", " ") if "@" in j else f"{j} {workdir}" for j in queue or []]
        body = ("exit 1" if queue is None
                else f"printf '%s\\n' {' '.join(shlex.quote(j) for j in lines)}")
        (bin_ / "squeue").write_text(f"#!/bin/sh\n{body}\n")
        record = f"echo \"$@\" >> {shlex.quote(str(cancelled))}"
        if refuse:
            record += "\necho 'scancel: error: Access/permission denied' >&2; exit 1"
        (bin_ / "scancel").write_text(f"#!/bin/sh\n{record}\n")
        for p in bin_.iterdir():
            p.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_}:/usr/bin:/bin")
        return cancelled
    return install


def write_log(where: Path, text: str = LOG) -> Path:
    """The log `where` (a folder: its run.snakemake.log)."""
    log = where / "run.snakemake.log" if where.is_dir() else where
    log.write_text(text)
    return log


def test_submitted_jobs_are_read_in_order_once():
    assert submitted_jobs(LOG) == ["11", "12", "14"]
    assert submitted_jobs("Finished jobid: 3 (Rule: teacher)\n") == []


def test_only_the_runs_jobs_still_queued_are_cancelled(tmp_path, slurm_clients, capsys):
    cancelled = slurm_clients(["9", "12", "14", "140"])      # 9, 140: not this run's
    assert cancel_leftovers(write_log(tmp_path), tmp_path) == ["12", "14"]
    assert cancelled.read_text() == "12 14\n"
    assert "cancelled SLURM jobs this run left running: 12 14" in capsys.readouterr().err


def test_a_job_of_the_same_id_in_another_folder_is_not_the_runs(tmp_path, slurm_clients):
    """Job ids are per cluster: the run's ids name its jobs only in the folder it submitted
    from (the plugin's sbatch -D)."""
    cancelled = slurm_clients([f"12@{tmp_path / 'elsewhere'}", "14"])
    assert cancel_leftovers(write_log(tmp_path), tmp_path) == ["14"]
    assert cancelled.read_text() == "14\n"


def test_nothing_is_cancelled_when_none_is_left(tmp_path, slurm_clients, capsys):
    cancelled = slurm_clients(["9"])
    assert cancel_leftovers(write_log(tmp_path), tmp_path) == []
    assert not cancelled.exists() and capsys.readouterr().err == ""


def test_the_hooks_list_of_logs_is_read_as_one_path_is(tmp_path, slurm_clients):
    """Snakemake passes an onerror hook its log files as a list."""
    cancelled = slurm_clients(["12"])
    other = write_log(tmp_path / "other.log", "Job 9 has been submitted with SLURM jobid 12 ()")
    assert cancel_leftovers([str(tmp_path / "gone.log"), other], tmp_path) == ["12"]
    assert cancelled.read_text() == "12\n"


@pytest.mark.parametrize("log", [None, "none", "missing", "local"])
def test_a_run_without_slurm_jobs_asks_nothing(tmp_path, slurm_clients, capsys, log):
    """No log, a missing one, a local run's: squeue is not asked (here it fails, which would
    print a message)."""
    slurm_clients(None)
    path = {None: None, "none": [], "missing": [tmp_path / "gone.log"],
            "local": write_log(tmp_path, "Finished jobid: 3 (Rule: teacher)\n")}[log]
    assert cancel_leftovers(path, tmp_path) == []
    assert capsys.readouterr().err == ""


def test_an_unanswered_squeue_names_the_jobs_to_check(tmp_path, slurm_clients, capsys):
    cancelled = slurm_clients(None)
    assert cancel_leftovers(write_log(tmp_path), tmp_path) == []
    assert not cancelled.exists()
    assert "submitted SLURM jobs 11 12 14" in capsys.readouterr().err


def test_a_refused_scancel_is_reported_with_the_jobs(tmp_path, slurm_clients, capsys):
    slurm_clients(["12"], refuse=True)
    assert cancel_leftovers(write_log(tmp_path), tmp_path) == ["12"]
    assert ("scancel failed (scancel: error: Access/permission denied) for SLURM jobs this run "
            "left running: 12") in capsys.readouterr().err
