# linvit ablation workflow: teacher -> distill -> finetune cells -> collect -> tables, figures, report.
# `snakemake dense` adds the dense tasks (UperNet, Mask R-CNN) on chosen backbones.
# The jobs (each with its paths, key and command) and the code-dependency map come from
# linvit.workflow (plan.py, jobs.py, deps.py); rules here only look them up.
import sys
from pathlib import Path

from snakemake.utils import min_version, validate

min_version("9.0")

# This checkout's src/, whatever is installed (jobs get the same through PYTHONPATH).
sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from linvit.workflow import check, grid  # noqa: E402


# The embedded default grid, unless --configfile gives a whole grid of its own (merging the two
# would hide what the file lacks, so one without a grid key is refused); --config key=value
# overrides apply either way.
if check.use_shipped_grid(config, workflow.overwrite_configfiles):

    configfile: "config/config.yaml"


validate(config, "workflow/schemas/config.schema.yaml")


# `snakemake --report report.html`: the tables and figures with their captions (workflow/report/)
report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/teacher.smk"
include: "workflow/rules/selection.smk"
include: "workflow/rules/transfer.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/dense.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/robustness.smk"
include: "workflow/rules/export.smk"


# The executor and its settings are known only once the run starts (not while this file is
# read): on SLURM, refuse a job-status command the cluster cannot answer before submitting.
onstart:
    from linvit.workflow import cluster

    cluster.check_executor(getattr(workflow.executor_plugin, "name", None),
                           workflow.executor_settings)


# Snakemake's Ctrl-C misses SLURM jobs under a status check at that instant (leftovers.py):
# cancel what this run submitted and squeue still lists, whatever ended the run. The plugin
# submits its jobs in the folder Snakemake started in (workdir_init, before any --directory).
onerror:
    import os

    from linvit.workflow import leftovers

    leftovers.cancel_leftovers(log, getattr(workflow, "workdir_init", os.getcwd()))


rule all:
    input:
        OUT.report,
