"""What a dense task declares."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DenseTask:
    name: str                    # the CLI stage and the grid's task name
    title: str                   # what the report calls it
    real_kind: str               # the real folder layout it trains on besides the scenes
    build: str                   # "module:function" -> mmengine config dict (cfg, width, ...)
    metrics: dict[str, str] = field(default_factory=dict)   # mmengine's name -> linvit's
    headline: tuple[str, ...] = ()   # the report table's columns, linvit names
    percent: bool = False        # mmengine reports fractions in [0, 1]: scaled to percent
    empty_means_zero: bool = False   # no metrics at all means every metric is 0 (see detect)
