"""`linvit list`: every registry and its entries (operators, sizes, datasets, losses, strategies,
stages, dense tasks, shift sets, checkpoint layouts, corruptions).

Its own module, resolved by name from the CLI, so that a stage's code-dependency map
(linvit.workflow.deps) does not take in every registry through the CLI."""
from __future__ import annotations

from linvit.attention import OPERATORS
from linvit.data import DATASETS
from linvit.models import SIZES
from linvit.transfer.losses import LOSSES
from linvit.transfer.strategies import STRATEGIES


def registries() -> dict[str, dict]:
    """Every axis one can add an entry to, by the name `linvit list` prints it under."""
    from linvit.dense.tasks import TASKS
    from linvit.models.layouts import LAYOUTS
    from linvit.robustness.corruptions import LIBRARY_CORRUPTIONS
    from linvit.robustness.shifts import SHIFTS
    from linvit.stages import STAGES

    return {"operators": OPERATORS, "sizes": SIZES, "datasets": DATASETS, "losses": LOSSES,
            "strategies": STRATEGIES, "stages": STAGES, "dense tasks": TASKS,
            "shift sets": SHIFTS, "checkpoint layouts": LAYOUTS,
            "corruptions": dict.fromkeys(LIBRARY_CORRUPTIONS)}


def print_registries() -> None:
    every = registries()
    print("losses:     ", ", ".join(f"{n} ({l.target})" for n, l in LOSSES.items()))
    print("strategies:")
    for s in STRATEGIES.values():
        print(f"  {s.name:18s} copy={sorted(s.copy)} distilled={sorted(s.distilled)}")
    for axis, entries in every.items():
        if axis not in ("losses", "strategies"):
            print(f"{axis + ':':20s}", ", ".join(entries))
