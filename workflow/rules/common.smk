# Shared wiring: the grid from linvit.workflow.grid, the code-dependency map from
# linvit.workflow.deps, and the command every job runs. Jobs use this checkout's src/
# (PYTHONPATH), whatever is installed.
#
# Shell commands quote every substitution ({x:q}); the only unquoted ones are complete argument
# strings built with shlex (grid.*_args, PYTHON), so no path or name can split or run a command.
import json
import os
import shlex
import sys
from pathlib import Path

from snakemake_interface_executor_plugins.settings import ExecMode

SRC = Path(workflow.basedir) / "src"

from linvit.workflow import cluster, dense_jobs, deps  # noqa: E402   (grid, check: the Snakefile)

# A profile's site settings ($LINVIT_SLURM_PARTITION, ...) must be set before any job is planned
# (and so before the config check, the slow part of planning a large grid).
cluster.check_site_settings(cluster.resource_expressions(workflow.resource_settings), os.environ)

# What every start would otherwise recompute, importing the registries and so torch (seconds): the
# config check's verdict and the code map, kept per code version in the working directory's
# Snakemake folder (linvit.workflow.memo), which cluster jobs share.
MEMO = Path.cwd() / ".snakemake" / "linvit"
deps.memoise_in(MEMO)

# The Snakemake that plans the run checks every job's config. The ones a cluster job starts to run
# one job (--mode remote in the batch script, subprocess under srun) read the same config: checking
# it again would import the whole training stack twice per job, for nothing.
if workflow.exec_mode == ExecMode.DEFAULT:
    check.check_config(config, str(Path(workflow.basedir) / "Snakefile"), MEMO)

RESULTS = config["results"]
CELLS = grid.expand_grid(config)
CELL_OF = {grid.cell_dir(RESULTS, c): c for c in CELLS}
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


def code(stage, operators=(), losses=(), datasets=()):
    """The stamp of the src files a job of `stage` runs (deps.code_stamp): editing one of them
    reruns exactly these jobs. Names are registry names (a grid's dataset entries:
    registry_dataset)."""
    return str(deps.code_stamp(MEMO / "code", stage, operators, losses, datasets))


def registry_dataset(name):
    """The dataset registry entry a grid dataset (a key of config["datasets"]) reads."""
    return config["datasets"][name]["dataset"]


def teacher_dir(wc):
    return grid.teacher_dir(RESULTS, wc.dataset, wc.teacher, wc.size)


def distill_dir(wc):
    return grid.distill_dir(RESULTS, wc.dataset, wc.teacher, wc.size, wc.operator, wc.loss)


def cell_of(wc):
    return grid.Cell(wc.dataset, wc.teacher, wc.size, wc.operator, wc.init, wc.loss,
                     int(wc.seed))


# The resources of every RUN_AND_RECORD job, which its command reads: GPUs and linvit processes
# (--nproc). None locally; a cluster profile's set-resources gives training rules theirs.
RUN_RESOURCES = dict(gpu=0, nproc=1)

# Every job: run linvit (which first checks that the code is what the job's stamp records), then
# write a record (ok or failed), so one failing job shows as failed in the tables instead of
# stopping the rest of the grid. A job killed by a signal (an interrupted
# workflow) leaves no record: it has not failed, and the next run resumes it.
RUN_AND_RECORD = """
status=0
{LINVIT} --nproc {resources.nproc:q} --code-stamp {input.code:q} {params.args} run.threads={threads} \
    > {log:q} 2>&1 || status=$?
if [ $status -ge 128 ]; then exit $status; fi
{REPORT} record --kind {params.kind:q} --key {params.key:q} --run-dir {params.dir:q} \
    --status $status --log {log:q} --out {output.record:q}
"""
