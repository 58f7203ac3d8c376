"""The workflow on a real single-node SLURM cluster (local_slurm.LocalSlurm: Debian's slurm-wlm and
munge, started for this session, no accounting database): a small grid with the benchmark
through the project's SLURM profile equals the same grid run locally, every job going through
sbatch; an interrupted run, local (Ctrl-C in a terminal) and on the cluster, resumes without
recomputing finished jobs (the local reference run is the local interrupt test: it needs no
SLURM and is not skipped without one); a job asking two
processes (the teacher) trains under torch.distributed inside its allocation; the shipped profile
refuses unset site settings and, as documented, reaches sbatch."""
from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import psutil
import pytest
import torch
import yaml
from safetensors.torch import load_file
from test_paper_toy import deit_tiny_file, imagenet_folder, shift_folders, toy_paper_config
from test_snakemake import TINY, copy_project, small_config, snakemake

from linvit.io import read_json
from linvit.workflow.leftovers import SUBMITTED, submitted_jobs

from local_slurm import PARTITION, LocalSlurm, Unavailable, wait_for

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "workflow" / "profiles" / "slurm" / "config.yaml"
# A cancelled job leaves the queue once its processes end: seconds on an idle node, minutes while
# the rest of the suite loads it (120 s was once too short). A deadline, not a measurement.
CANCEL_DEADLINE = 600
# The teacher asks two processes (linvit --nproc 2), in both runs, so that they compute the same.
TWO_PROCESSES = ("--set-resources", "teacher:nproc=2")


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    # A SIGTERM (a CI timeout, `kill`) stops the session as Ctrl-C does, so the teardown below
    # still stops the daemons and cancels what runs, instead of leaving them to outlive pytest.
    previous = signal.signal(signal.SIGTERM, _interrupted)
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except Unavailable as e:
        signal.signal(signal.SIGTERM, previous)
        pytest.skip(f"no local SLURM cluster: {e}")
    except BaseException:
        cluster.stop()
        signal.signal(signal.SIGTERM, previous)
        raise
    yield cluster
    cluster.stop()
    signal.signal(signal.SIGTERM, previous)


def site_env(slurm: LocalSlurm) -> dict:
    """What a user of this cluster sets: its partition, no account (it keeps none)."""
    return {**slurm.env(), "LINVIT_SLURM_PARTITION": PARTITION, "LINVIT_SLURM_ACCOUNT": ""}


def local_profile(project: Path) -> Path:
    """The shipped SLURM profile with what this 2-core CPU node needs: no GPUs and one process
    per job, memory that fits, the local profile's threads (so that both runs compute the same
    numbers), squeue for job status (no accounting here), checked from the first second on and
    every 2 s."""
    profile = yaml.safe_load(SHIPPED.read_text())
    local = yaml.safe_load((ROOT / "workflow/profiles/local/config.yaml").read_text())
    cpu = {"gpu": 0, "nproc": 1, "mem_mb": 2000, "runtime": 30}
    profile.update({
        "slurm-status-command": "squeue", "slurm-init-seconds-before-status-checks": 1,
        # jobs here last seconds: a status round every 2 s, not 10, so Snakemake does not idle
        "seconds-between-status-checks": 2,
        "default-resources": {**profile["default-resources"], **cpu},
        "set-threads": local["set-threads"],
        "set-resources": {rule: {**res, **cpu} for rule, res in profile["set-resources"].items()}})
    path = project / "profiles" / "local-slurm"
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    return path


def on_slurm(project: Path, slurm: LocalSlurm, *args: str,
             timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", *args,
                           "--workflow-profile", str(project / "profiles" / "local-slurm")],
                          cwd=project, env=site_env(slurm), capture_output=True, text=True,
                          timeout=timeout)


def grid_config(results: str, mnist_root: Path) -> dict:
    """The small grid cut to two cells (random, copy_mlp+distill: one finishes before the
    interrupt, the other waits on the interrupted distillation) and the benchmark, whose threads
    used to need a total number of cores that a cluster run does not have."""
    return {**small_config(results, mnist_root, reference_strategies=[],
                           strategies=["random", "copy_mlp+distill"]), "bench": TINY["bench"]}


def persisted(project: Path, kind: str) -> set[str]:
    """Outputs with a file in Snakemake's .snakemake/<kind> folder, named by the urlsafe base64
    of the path, split into '@'-prefixed folders past the file-name limit."""
    marks = project / ".snakemake" / kind
    return {base64.urlsafe_b64decode("".join(part.lstrip("@")
                                             for part in p.relative_to(marks).parts)).decode()
            for p in marks.rglob("*") if p.is_file()} if marks.is_dir() else set()


def incomplete_outputs(project: Path) -> set[str]:
    """Outputs Snakemake marked incomplete (started, not finished)."""
    return persisted(project, "incomplete")


def counted_finished(project: Path) -> set[str]:
    """Outputs the Snakemake that plans the run has seen finish: it alone writes their metadata.
    (Not the lack of an incomplete mark: the Snakemake inside a SLURM job removes that mark
    when its job ends, before the planning one has seen it end.)"""
    return persisted(project, "metadata")


# The cell that depends on the teacher alone: it finishes while the distillation is frozen.
RANDOM_CELL = "cells/synthetic/pretrain/cpu96/linear/random/none/seed0/record.json"
TEACHER = "teachers/synthetic/pretrain/cpu96/record.json"


def is_distill_job(proc: psutil.Process, results: Path) -> bool:
    """Whether `proc` is a linvit distill job writing under `results`."""
    words = proc.cmdline()
    return ("linvit.cli" in words and "distill" in words
            and any(str(results) in w for w in words))


def freeze_the_distillation(processes, project: Path, results: Path) -> psutil.Process:
    """The distill job writing under `results`, found among `processes()` (asked again until it
    runs: a workflow's children, or every process for jobs under slurmd), stopped (SIGSTOP) while
    it runs: it cannot finish, so the interrupt that follows lands mid-job whatever the timing.
    Returned once the random-init cell, which runs beside it, has finished as Snakemake counts
    it: a finished job for the resume to keep."""
    def stopped():
        for proc in processes():
            try:
                if not is_distill_job(proc, results):
                    continue
                proc.suspend()
                wait_for("the stop", lambda p=proc: p.status() in (psutil.STATUS_STOPPED,
                                                                   psutil.STATUS_ZOMBIE), 30)
                if proc.status() == psutil.STATUS_STOPPED:
                    return proc
            except psutil.NoSuchProcess:       # ended before it could be stopped: the next one
                pass
        return None
    job = wait_for("the distill job running", stopped, 600)
    cell = results / RANDOM_CELL
    wait_for("the random-init cell finished", lambda: str(cell) in counted_finished(project), 900)
    return job


def interrupt_grid(project: Path, slurm: LocalSlurm, args: list[str], results: Path):
    """The whole grid, interrupted as Ctrl-C does while a training job runs and Snakemake checks
    its jobs' status; returns the stopped job's record path and Snakemake's log. Snakemake's own
    cancel misses the jobs under that check (leftovers.py); the workflow's onerror hook cancels
    them, so none that the log names is left."""
    log = project / "interrupted.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "snakemake", *args], cwd=project,
                                env=site_env(slurm), stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        job = freeze_the_distillation(psutil.process_iter, project, results)
        words = job.cmdline()
        interrupted = Path(words[words.index("-o") + 1]) / "record.json"
        with slurm.stalled_status_checks() as under_way:
            under_way()
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=300)
        submitted = set(submitted_jobs(log.read_text()))
        slurm.wait_for_empty_queue("the run's jobs gone", CANCEL_DEADLINE,
                                   jobs=lambda: submitted & set(slurm.queue()))
        # A job whose sbatch was under way at the interrupt is in no log (the plugin submits
        # from a thread): cancelled here, as docs/cluster.md tells users to.
        slurm.cancel_from(project)
        slurm.wait_for_empty_queue("the cancelled jobs gone", CANCEL_DEADLINE)
    finally:
        if proc.poll() is None:                # the test failed: leave no workflow behind
            proc.kill()
            proc.wait()
    with contextlib.suppress(psutil.NoSuchProcess):    # cancelled: it dies on its SIGTERM
        job.resume()
    text = log.read_text()
    assert "Terminating processes on user request" in text, text[-3000:]
    # Snakemake's cancel missed the jobs under the check and the hook cancelled them; without
    # this line a later Snakemake may have fixed that (then leftovers.py can go)
    assert "linvit: cancelled SLURM jobs this run left running:" in text, text[-3000:]
    return interrupted, text


def interrupted_and_resumed(run, project: Path, args: list[str], results: Path,
                            interrupt) -> dict:
    """The whole grid, interrupted by `interrupt` while the distillation runs (the teacher and the
    random-init cell done), then resumed: what was done when it stopped, the interrupted job's
    record."""
    interrupted, interrupted_log = interrupt(project, args, results)
    in_flight = incomplete_outputs(project)      # finished while Snakemake stopped: rerun
    done = {p: p.stat().st_mtime_ns for p in results.glob("**/record.json")
            if str(p) not in in_flight}
    assert {results / TEACHER, results / RANDOM_CELL} <= set(done), sorted(map(str, done))
    resumed = run(*args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return {"results": results, "interrupted": interrupted, "done": done,
            "logs": [interrupted_log, resumed.stderr]}


def ctrl_c_in_a_terminal(project: Path, args: list[str], results: Path) -> tuple[Path, str]:
    """The whole grid, interrupted as Ctrl-C in a terminal does: SIGINT to the process group
    (Snakemake, job shells, jobs) while a training job is frozen, which gets it on SIGCONT. A
    shell without job control starts background commands with SIGINT ignored, and children
    inherit that; restore the default."""
    proc = subprocess.Popen([sys.executable, "-m", "snakemake", *args], cwd=project,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        snake = psutil.Process(proc.pid)
        job = freeze_the_distillation(lambda: snake.children(recursive=True), project, results)
        words = job.cmdline()
        interrupted = Path(words[words.index("-o") + 1]) / "record.json"
        os.killpg(proc.pid, signal.SIGINT)
        job.resume()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:               # the test failed: leave no workflow behind
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return interrupted, ""


@pytest.fixture(scope="module")
def local_grid(tmp_path_factory, mnist_root):
    """The grid run locally with the local profile, interrupted by Ctrl-C once and resumed: the
    local resume test's run and the reference the cluster run is compared to. (No SLURM needed.)"""
    project = copy_project(tmp_path_factory.mktemp("local"))
    results = project / "results"
    (project / "config" / "grid.yaml").write_text(
        yaml.safe_dump(grid_config(str(results), mnist_root), sort_keys=False))
    args = ["--workflow-profile", "workflow/profiles/local", *TWO_PROCESSES,
            "--configfile", "config/grid.yaml"]
    return interrupted_and_resumed(lambda *a: snakemake(project, *a), project, args, results,
                                   ctrl_c_in_a_terminal)


@pytest.fixture(scope="module")
def grids(tmp_path_factory, mnist_root, slurm, local_grid):
    """The same grid run locally and on SLURM, each interrupted once and resumed."""
    project = copy_project(tmp_path_factory.mktemp("cluster"))
    profile = local_profile(project)
    results = project / "results"
    (project / "config" / "grid.yaml").write_text(
        yaml.safe_dump(grid_config(str(results), mnist_root), sort_keys=False))
    args = [*TWO_PROCESSES, "--configfile", "config/grid.yaml"]
    cluster = interrupted_and_resumed(
        lambda *a: on_slurm(project, slurm, *a), project, args, results,
        lambda project, args, results: interrupt_grid(
            project, slurm, [*args, "--workflow-profile", str(profile)], results))
    return {"local": local_grid["results"], "cluster": cluster["results"], **cluster}


def check_resumed(run: dict) -> None:
    """Finished jobs kept, the interrupted one rerun, the grid completed."""
    done, interrupted, results = run["done"], run["interrupted"], run["results"]
    assert interrupted not in done
    cells = list(results.glob("cells/**/record.json"))
    assert 1 <= len([p for p in done if "/cells/" in str(p)]) < len(cells) == 2
    assert all(p.stat().st_mtime_ns == t for p, t in done.items())     # finished jobs kept
    assert json.loads(interrupted.read_text())["status"] == "ok"
    assert (results / "report.md").is_file()


def test_an_interrupted_workflow_resumes_without_recomputing(local_grid):
    """Ctrl-C mid-job on a local run: the next run (the local profile's --rerun-incomplete)
    reruns only unfinished jobs, leaves finished ones untouched and completes the grid."""
    check_resumed(local_grid)


def test_the_grid_on_slurm_computes_what_the_local_run_computes(grids):
    local, cluster = grids["local"], grids["cluster"]
    tables = sorted(p.name for p in (local / "tables").iterdir())
    assert tables == sorted(p.name for p in (cluster / "tables").iterdir())
    assert "main.csv" in tables and "claims.csv" in tables
    for name in tables:
        if name.startswith("time_to_target."):      # its seconds are each run's own
            continue
        assert (cluster / "tables" / name).read_text() == (local / "tables" / name).read_text(), \
            name
    costs = [pd.read_csv(g / "tables" / "time_to_target.csv").drop(columns="seconds")
             for g in (local, cluster)]
    pd.testing.assert_frame_equal(*costs)
    assert "failed" not in (cluster / "results.csv").read_text()
    bench = json.loads((cluster / "bench" / "record.json").read_text())
    assert bench["status"] == "ok"
    assert "## Operator benchmark" in (cluster / "report.md").read_text()


def test_every_job_of_the_cluster_run_went_through_sbatch(grids, slurm):
    """Each job Snakemake ran was submitted (never run on the submit host), and SLURM recorded
    each submission; every linvit run ran inside the SLURM job that SLURM recorded as done."""
    ended = {job["JobId"]: job["JobState"] for job in slurm.completed_jobs()}
    for log in grids["logs"]:
        ran = re.findall(r"^rule (\w+):$", log, re.M)
        submitted = SUBMITTED.findall(log)
        assert ran and len(submitted) == len(ran), log[-3000:]
        assert set(submitted) <= set(ended)
    assert not re.findall(r"^localrule (?!all:)", "\n".join(grids["logs"]), re.M)
    runs = [p.parent for p in grids["cluster"].glob("**/metrics.json")]
    assert len(runs) >= 5                      # teacher, distill, two cells, maps
    for run in runs:
        env = json.loads((run / "metrics.json").read_text())["env"]
        assert ended.get(env["slurm_job"]) == "COMPLETED", (run, env)


def test_an_interrupted_cluster_run_resumes_without_recomputing(grids):
    """Ctrl-C while a training job runs (and others wait in the queue): Snakemake cancels its
    SLURM jobs, and the next run reruns only unfinished jobs and completes the grid."""
    check_resumed(grids)


def test_a_job_asking_two_processes_runs_them_in_its_allocation(grids, slurm):
    """The teacher's nproc=2: `linvit --nproc 2` inside one SLURM job of two cores, two CPU
    processes under torch.distributed, each with its share of the job's threads."""
    record = grids["cluster"] / "teachers/synthetic/pretrain/cpu96/record.json"
    assert json.loads(record.read_text())["status"] == "ok"
    env = json.loads((record.parent / "metrics.json").read_text())["env"]
    assert (env["processes"], env["threads"], env["cuda_devices"]) == (2, 1, None)
    job = [j for j in slurm.completed_jobs() if j["JobId"] == env["slurm_job"]]
    assert [(j["JobState"], j["ProcCnt"]) for j in job] == [("COMPLETED", "2")]


def test_the_shipped_profile_refuses_unset_site_settings(tmp_path):
    """At once: before the config check (here given a bad operator name too), which takes most
    of a minute on the paper grid."""
    project = copy_project(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LINVIT_SLURM_")}
    run = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--workflow-profile",
                          "workflow/profiles/slurm", "--configfile", "config/paper.yaml",
                          "--config", "operators=[lineer]"],
                         cwd=project, env=env, capture_output=True, text=True, timeout=300)
    output = run.stdout + run.stderr
    assert run.returncode != 0
    assert ("LINVIT_SLURM_PARTITION, LINVIT_SLURM_ACCOUNT are not set:\n"
            "  LINVIT_SLURM_PARTITION: the partition jobs run in") in output, output[-2000:]
    assert "lineer" not in output


def test_the_documented_command_reaches_sbatch(tmp_path, slurm):
    """`snakemake --workflow-profile workflow/profiles/slurm --configfile <paper-shaped config>`,
    the shipped profile unchanged: on this cluster (no accounting) sacct is refused before any
    submission; with squeue, as the message says, jobs are submitted (then Ctrl-C)."""
    project = copy_project(tmp_path / "project")
    config = toy_paper_config(imagenet_folder(tmp_path / "imagenet"),
                              deit_tiny_file(tmp_path / "deit_t.safetensors"),
                              shift_folders(tmp_path / "shifts"))
    (project / "config" / "paper_toy.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    command = [sys.executable, "-m", "snakemake", "--workflow-profile", "workflow/profiles/slurm",
               "--configfile", "config/paper_toy.yaml"]
    before = len(slurm.completed_jobs())
    refused = subprocess.run(command, cwd=project, env=site_env(slurm), capture_output=True,
                             text=True, timeout=300)
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0
    assert "slurm-status-command is sacct, but this cluster has no accounting database" in \
        output, output[-3000:]
    assert not SUBMITTED.search(output) and not slurm.queue()
    log = tmp_path / "squeue.log"
    with open(log, "w") as out:
        # (the first status check after 1 s, not 40: Ctrl-C waits for it)
        proc = subprocess.Popen([*command, "--slurm-status-command", "squeue",
                                 "--slurm-init-seconds-before-status-checks", "1"], cwd=project,
                                env=site_env(slurm), stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_for("a submission", lambda: SUBMITTED.search(log.read_text()), 300)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=300)
        # The plugin submits from a thread: a submission still in flight when Ctrl-C lands is in
        # no list or log that Snakemake or the onerror hook cancels from, and these jobs ask more
        # than this node has, so they would wait in the queue for good. (The interrupt test
        # checks the cancel on Ctrl-C.)
        slurm.cancel_from(project)
        slurm.wait_for_empty_queue("the cancelled jobs gone", CANCEL_DEADLINE)
    assert len(slurm.completed_jobs()) > before


# Loaded by the job's Python (PYTHONPATH): in its first run, at optimizer update
# LINVIT_TEST_REQUEUE_AT, it asks `scontrol requeue` for its own job, as an operator or the
# scheduler would, then trains on no further until SLURM's SIGTERM has reached linvit's handler.
REQUEUE_ONCE = '''
import os, signal, subprocess, time
from pathlib import Path
marker = Path(os.environ.get("LINVIT_TEST_MARKER", "/nonexistent/marker"))
if "SLURM_JOB_ID" in os.environ and not marker.exists():
    from linvit.train import trainer
    at = int(os.environ["LINVIT_TEST_REQUEUE_AT"])
    class RequeueAt:
        def __bool__(self): return True
        def step(self, update, loss, lr):
            if update != at:
                return
            marker.write_text(os.environ["SLURM_JOB_ID"])
            subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], check=True)
            preemption = signal.getsignal(signal.SIGTERM).__self__
            deadline = time.monotonic() + 120
            while not preemption.requested and time.monotonic() < deadline:
                time.sleep(0.05)
        def epoch(self, record, update): pass
        def close(self): pass
    trainer.open_loggers = lambda *a, **k: RequeueAt()
'''


def test_a_running_job_requeued_by_scontrol_resumes_bit_identical(tmp_path, slurm, mnist_root):
    """`scontrol requeue` of a running training job: SLURM's SIGTERM stops linvit at the next
    step, which saves that step's checkpoint and exits EXIT_PREEMPTED; SLURM runs the job again,
    and the run resumes there and ends with the weights and metrics of a run never requeued."""
    args = ["pretrain", f"data.root={mnist_root}", "data.train_subset=512", "data.batch_size=64",
            "optim.epochs=2", "optim.warmup_epochs=1", "model.size=cpu64", "model.drop_path=0.1",
            "aug.mixup=0.8", "run.progress=false", "run.threads=1", "run.loggers=[]"]
    env = {**slurm.env(), "OMP_NUM_THREADS": "1"}
    python = [sys.executable, "-m", "linvit.cli"]
    whole = subprocess.run([*python, args[0], "-o", str(tmp_path / "whole"), *args[1:]],
                           env=env, capture_output=True, text=True, timeout=600)
    assert whole.returncode == 0, whole.stderr[-3000:]
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(REQUEUE_ONCE)
    script = tmp_path / "job.sh"
    runs = shlex.quote(str(tmp_path / "runs"))
    script.write_text("#!/bin/bash\n"
                      f'echo "run ${{SLURM_RESTART_COUNT:-0}} $(date +%s)" >> {runs}\n'
                      f"exec {shlex.join(python)} {args[0]} -o {tmp_path / 'cut'} "
                      f"{shlex.join(args[1:])}\n")
    job_env = {**env, "PYTHONPATH": str(tmp_path / "hook"),
               "LINVIT_TEST_MARKER": str(tmp_path / "requeued"),
               "LINVIT_TEST_REQUEUE_AT": str(512 // 64 + 3)}      # epoch 2, update 3
    submitted = subprocess.run(["sbatch", "--parsable", "--requeue", "--export=ALL",
                                "--open-mode=append", "-p", PARTITION, "-c", "1", "--mem=2000",
                                "-o", str(tmp_path / "job-%j.out"), str(script)],
                               env=job_env, capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    # SLURM holds a requeued job back for a while (its begin time, about two minutes here): once
    # it is pending again, let it start now, as a busy cluster would start it whenever it can
    wait_for("the job requeued and pending", lambda: (tmp_path / "requeued").exists() and
             slurm.client("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "PENDING",
             CANCEL_DEADLINE)
    slurm.client("scontrol", "update", f"JobId={job}", "StartTime=now")
    slurm.wait_for_empty_queue(f"job {job} requeued and finished", CANCEL_DEADLINE,
                               jobs=lambda: [j for j in slurm.queue() if j == job])
    assert (tmp_path / "requeued").read_text() == job
    runs = [line.split() for line in (tmp_path / "runs").read_text().splitlines()]
    assert [r[:2] for r in runs] == [["run", "0"], ["run", "1"]], runs
    out = (tmp_path / f"job-{job}.out").read_text()
    # stopped at the step it was signalled in, and resumed there, not at the epoch's checkpoint
    assert "preempted: " in out and "after epoch 1 and step 3 of the next" in out, out[-3000:]
    a, b = (load_file(tmp_path / d / "model.safetensors") for d in ("whole", "cut"))
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    assert read_json(tmp_path / "cut" / "metrics.json")["top1"] == \
        read_json(tmp_path / "whole" / "metrics.json")["top1"]
    ends = [j["JobState"] for j in slurm.completed_jobs() if j["JobId"] == job]
    assert ends[-1] == "COMPLETED", ends
