# linvit ablation workflow: teacher -> distill -> finetune cells -> collect -> tables, figures, report.
# `snakemake dense` adds the dense tasks (UperNet, Mask R-CNN) on chosen backbones.
# The grid, paths, CLI arguments and code-dependency map come from linvit (src/linvit/grid.py,
# src/linvit/deps.py); rules here only wire them.
from snakemake.utils import min_version, validate

min_version("9.0")


# The embedded default grid, unless --configfile gives a whole grid of its own (Snakemake would
# otherwise merge the two); --config key=value overrides apply either way.
if "datasets" not in config:

    configfile: "config/config.yaml"


validate(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/teacher.smk"
include: "workflow/rules/transfer.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/dense.smk"
include: "workflow/rules/bench.smk"


rule all:
    input:
        f"{RESULTS}/report.md",
