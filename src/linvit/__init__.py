"""linvit: turn pretrained softmax ViTs into linear-attention ViTs (copy the MLPs, distill the
attention)."""
from importlib.metadata import PackageNotFoundError, version

from linvit.timm_hook import register_when_timm_loads

try:
    __version__ = version("linvit")
except PackageNotFoundError:          # run from a source tree that was never installed
    __version__ = "0+unknown"

register_when_timm_loads()


# The Python API (linvit.api, docs/api.md), imported on first use: `import linvit` stays light for
# the workflow, which imports linvit's config code on every Snakemake start. By importlib, so that
# the workflow's import graph (linvit.workflow.deps) does not put the API in every job's code.
API = ("convert", "distill", "finetune", "evaluate")


def __getattr__(name: str):
    if name in API:
        import importlib

        return getattr(importlib.import_module("linvit.api"), name)
    raise AttributeError(f"module 'linvit' has no attribute {name!r}")
