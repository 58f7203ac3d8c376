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


def new_grid(panels: int, columns: int = 4, width: float = 3.6, height: float = 3.0):
    """Panels in rows of at most `columns` (a grid of many students stays readable); the axes
    in reading order, the unused ones removed."""
    panels = max(panels, 1)
    cols = min(columns, panels)
    rows = -(-panels // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[panels:]:
        fig.delaxes(ax)
    return fig, flat[:panels]


def colours(names: list[str]) -> dict[str, str]:
    """One colour per name (an init strategy), by its place in the grid's order: the same
    strategy has the same colour in every figure of a report."""
    palette = plt.get_cmap("tab10" if len(names) <= 10 else "tab20").colors
    return {name: matplotlib.colors.to_hex(palette[i % len(palette)])
            for i, name in enumerate(names)}


def legend_below(fig, handles: list, labels: list[str], title: str | None = None) -> None:
    """One legend for the figure, under its panels (never over a curve or a bar)."""
    unique = dict(zip(labels, handles))
    fig.legend(list(unique.values()), list(unique), loc="upper center",
               bbox_to_anchor=(0.5, 0.0), ncol=min(4, max(len(unique), 1)), fontsize=7,
               title=title, title_fontsize=7, frameon=False)


def lay_out(fig) -> None:
    """Panels spaced so that one's tick labels clear the next one's."""
    fig.tight_layout(w_pad=1.5)


def save(fig, stem: Path) -> None:
    """PNG and PDF, laid out (lay_out); the saved area grows to hold what lies outside the
    panels (legends)."""
    lay_out(fig)
    for ext in ("png", "pdf"):
        write_atomic(Path(f"{stem}.{ext}"),
                     lambda p, ext=ext: fig.savefig(p, format=ext, dpi=130,
                                                    bbox_inches="tight"))
    plt.close(fig)
