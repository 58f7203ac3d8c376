"""The dense-task registry: every task is complete, and the workflow's check reads it."""
from __future__ import annotations

import importlib

import pytest

from linvit.dense.configs import required_paths
from linvit.dense.tasks import TASKS
from linvit.errors import ConfigError
from linvit.stages import STAGES
from linvit.workflow import check

from grid_configs import default_config


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_dense_task_is_a_stage_with_a_config_builder_and_its_metrics(name):
    task = TASKS[name]
    assert task.name == name and name in STAGES
    module, function = task.build.split(":")
    assert callable(getattr(importlib.import_module(module), function))
    assert task.headline and set(task.headline) <= set(task.metrics.values())
    assert required_paths(task.real_kind), f"{task.real_kind}: no folder layout to check"


def test_a_dense_task_outside_the_registry_is_refused_before_any_job():
    config = default_config()
    config["dense"] = {**config["dense"], "tasks": ["segment", "panoptic"]}
    with pytest.raises(ConfigError, match="dense.tasks: \\['panoptic'\\] not in: segment"):
        check.check_config(config, "Snakefile")
