"""`linvit list`: every registry and its entries (operators, sizes, datasets, losses, strategies).

Its own module, resolved by name from the CLI, so that a stage's code-dependency map
(linvit.workflow.deps) does not take in every registry through the CLI."""
from __future__ import annotations

from linvit.attention import OPERATORS
from linvit.data import DATASETS
from linvit.models import SIZES
from linvit.transfer.losses import LOSSES
from linvit.transfer.strategies import STRATEGIES


def print_registries() -> None:
    print("operators:  ", ", ".join(OPERATORS))
    print("sizes:      ", ", ".join(SIZES))
    print("datasets:   ", ", ".join(DATASETS))
    print("losses:     ", ", ".join(f"{n} ({l.target})" for n, l in LOSSES.items()))
    print("strategies:")
    for s in STRATEGIES.values():
        print(f"  {s.name:18s} copy={sorted(s.copy)} distilled={sorted(s.distilled)}")
