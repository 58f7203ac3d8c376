"""linvit's model as a timm model: `import linvit` registers the entrypoint `linvit_vit`, so that
`timm.create_model("local-dir:DIR", pretrained=True)` (or "hf-hub:ORG/NAME") rebuilds a folder
that `linvit export` wrote.

timm takes seconds to import, and most `linvit` commands (the CLI's help, `linvit plan`, the
Snakefile) never need it: the entrypoint is registered the moment timm is imported, by whoever
imports it first, through a finder that waits on sys.meta_path for timm alone.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys

ARCHITECTURE = "linvit_vit"


def linvit_vit(pretrained: bool = False, **kwargs):
    """timm's entrypoint: the model a `linvit export` folder describes (its config.json's
    model_args hold the linvit model spec)."""
    import importlib

    # by name: the model code is not a dependency of every module that imports linvit (the
    # workflow's code map, linvit.workflow.deps, follows imports)
    return importlib.import_module("linvit.models.hub").build_for_timm(pretrained, **kwargs)


def register() -> None:
    from timm.models import is_model, register_model

    if not is_model(ARCHITECTURE):
        register_model(linvit_vit)


class _AfterTimm(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when `timm` is looked up, it asks the other finders, and wraps the
    loader so that `register` runs once timm's own module has finished executing."""

    def find_spec(self, name, path=None, target=None):
        if name != "timm":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            register()

        spec.loader.exec_module = exec_module
        return spec


def register_when_timm_loads() -> None:
    if "timm" in sys.modules:
        register()
    elif not any(isinstance(f, _AfterTimm) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTimm())
