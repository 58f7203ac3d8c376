# Shared wiring: the jobs from linvit.workflow.plan (each rule looks its job up by its wildcards),
# the code-dependency map from linvit.workflow.deps, and the command every job runs. Jobs use this checkout's src/
# (PYTHONPATH), whatever is installed.
#
# Shell commands quote every substitution ({x:q}); the only unquoted ones are complete argument
# strings built with shlex (Job.command, PYTHON), so no path or name can split or run a command.
import json
import os
import shlex
import sys
from pathlib import Path

from snakemake_interface_executor_plugins.settings import ExecMode

SRC = Path(workflow.basedir) / "src"

from linvit.workflow import cluster, cost, dense_jobs, deps, plan, shared  # noqa: E402   (check: Snakefile)
from linvit.report.paths import COLLECTED, FIGURES, TABLE_FORMATS, ResultsFolder  # noqa: E402
from linvit.workflow.jobs import KINDS  # noqa: E402

# A profile's site settings ($LINVIT_SLURM_PARTITION, ...) must be set before any job is planned
# (and so before the config check, the slow part of planning a large grid).
cluster.check_site_settings(cluster.resource_expressions(workflow.resource_settings), os.environ)

# What every start would otherwise recompute, importing the registries and so torch (seconds): the
# config check's verdict and the code map, kept per code version in the working directory's
# Snakemake folder (linvit.workflow.memo), which cluster jobs share.
# Relative to the working directory, as every job input is: a finished grid copied or moved to
# another folder (a new clone, another mount point) keeps its inputs' names and plans nothing.
MEMO = Path(".snakemake") / "linvit"
deps.memoise_in(MEMO)

def _config_name():
    """The grid's config file as given (--configfile), else the shipped one."""
    files = workflow.overwrite_configfiles
    return str(files[-1]) if files else "config/config.yaml"


# The Snakemake that plans the run checks every job's config, and says what the grid costs. The ones a cluster job starts to run
# one job (--mode remote in the batch script, subprocess under srun) read the same config: checking
# it again would import the whole training stack twice per job, for nothing.
if workflow.exec_mode == ExecMode.DEFAULT:
    SNAKEFILE = str(Path(workflow.basedir) / "Snakefile")
    check.check_config(config, SNAKEFILE, MEMO)
    print(cost.plan_line(config, _config_name(), SNAKEFILE, MEMO), file=sys.stderr)

RESULTS = config["results"]
OUT = ResultsFolder(RESULTS)      # the aggregate files' paths (each job's own: its kind's pattern)
PLAN = plan.plan(config)          # the grid, expanded once
# A job of a shared jobs_folder that another grid made with other settings: refused, not redone
# (by the planning Snakemake alone: it reads every shared job's record, which no job needs again).
if workflow.exec_mode == ExecMode.DEFAULT:
    shared.check_not_foreign(PLAN)
# Every job's code stamp, written now: a stamp that cannot be written or read stops the plan
# here with its reason, where inside an input function Snakemake would drop the job instead.
for _job in PLAN.jobs:
    deps.code_stamp(MEMO / "code", *_job.code)
CELLS = PLAN.cells
PYTHON = f"PYTHONPATH={shlex.quote(str(SRC))} {shlex.quote(sys.executable)}"
LINVIT = f"{PYTHON} -m linvit.cli"
REPORT = f"{PYTHON} -m linvit.report.cli"


wildcard_constraints:
    dataset="[^/]+",
    teacher="[^/]+",
    size="[^/]+",
    operator="[^/]+",
    init="[^/]+",
    loss="[^/]+",
    seed=r"\d+",
    model="[^/]+",
    backbone="[^/]+",
    **PLAN.constraints(),   # each config axis (linvit.workflow.axes): one folder level


def code(stage, operators=(), losses=(), datasets=()):
    """The stamp of the src files a job of `stage` runs (deps.code_stamp): editing one of them
    reruns exactly these jobs. Names are registry names."""
    return str(deps.code_stamp(MEMO / "code", stage, operators, losses, datasets))


def pattern(kind, part="output"):
    """A job kind's output, log or benchmark pattern (linvit.workflow.jobs.KINDS, with the
    grid's config axes)."""
    return PLAN.pattern(kind, part)


def job_inputs(kind):
    """A rule's input function: the records (and files) its job reads."""
    return lambda wc: PLAN.find(kind, wc).inputs


def job_code(kind):
    return lambda wc: code(*PLAN.find(kind, wc).code)


def job_params(kind):
    """What RUN_AND_RECORD reads of a job: its record kind and key, run folder and command."""
    return dict(kind=KINDS[kind].record_kind,
                dir=lambda wc: PLAN.find(kind, wc).run_dir,
                key=lambda wc: PLAN.find(kind, wc).key_json(),
                args=lambda wc: PLAN.find(kind, wc).command(),
                digest=lambda wc: shared.digest(PLAN.find(kind, wc).command()))


# The resources of every RUN_AND_RECORD job, which its command reads: GPUs and linvit processes
# (--nproc). None locally; a cluster profile's set-resources gives training rules theirs.
RUN_RESOURCES = dict(gpu=0, nproc=1)

# Every job: run linvit (which first checks that the code is what the job's stamp records), then
# write a record (ok or failed), so one failing job shows as failed in the tables instead of
# stopping the rest of the grid. A job killed by a signal (an interrupted workflow) leaves no
# record: it has not failed, and the next run resumes it. The record names the grid and the
# command's digest that made the job (linvit.workflow.shared); the grid through the shell, not
# params, where it would make another grid sharing the job rerun it (the digest is the same in
# every grid that shares the job).
RUN_AND_RECORD = """
status=0
{LINVIT} --nproc {resources.nproc:q} --code-stamp {input.code:q} {params.args} run.threads={threads} \
    > {log:q} 2>&1 || status=$?
if [ $status -ge 128 ]; then exit $status; fi
{REPORT} record --kind {params.kind:q} --key {params.key:q} --run-dir {params.dir:q} \
    --status $status --log {log:q} --grid-results {RESULTS:q} \
    --command-digest {params.digest:q} --out {output.record:q}
"""
