"""Shared matplotlib set-up: headless backend, one row of panels, atomic PNG + PDF output."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

from linvit.io import write_atomic  # noqa: E402


def new_figure(panels: int, width: float = 4.0, height: float = 3.4):
    panels = max(panels, 1)
    fig, axes = plt.subplots(1, panels, figsize=(width * panels, height), squeeze=False)
    return fig, list(axes[0])


def save(fig, stem: Path) -> None:
    """PNG and PDF; the saved area grows to hold what lies outside the panels (legends)."""
    fig.tight_layout()
    for ext in ("png", "pdf"):
        write_atomic(Path(f"{stem}.{ext}"),
                     lambda p, ext=ext: fig.savefig(p, format=ext, dpi=130,
                                                    bbox_inches="tight"))
    plt.close(fig)
