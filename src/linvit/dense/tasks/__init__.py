"""The dense-task registry: what each `linvit <task>` trains and reports. A new task is one file
here (its DenseTask) and one line in TASKS, plus its stage line in linvit.stages; the grid's
schema check, the workflow's wildcards and the report's columns read TASKS.

Light to import (the workflow reads it): names only; mmengine configs are built on first use.
"""
from __future__ import annotations

from linvit.dense.tasks.base import DenseTask
from linvit.dense.tasks.detect import DETECT
from linvit.dense.tasks.segment import SEGMENT
from linvit.registry import Registry

TASKS: Registry[DenseTask] = Registry.by_name("dense task", SEGMENT, DETECT)

__all__ = ["TASKS", "DenseTask"]
