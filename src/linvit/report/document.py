"""results/report.md: the tables, the figures, the paper's claims decided on this grid, failures.

The claims section gives each claim of arXiv 2609.35745 its paired contrast over seeds, its 95%
CI and a verdict (linvit.report.claims), so a claim that does not reproduce here says so, and
one that the seeds cannot decide says that.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from linvit.io import write_text
from linvit.report.claims import method
from linvit.report.grid import Grid

SECTIONS = {"main": "Main table", "loss_design": "Loss design",
            "distill_quality": "Distillation quality",
            "selection": "Fine-tuning settings chosen on validation", "by_dataset": "By dataset",
            "by_teacher": "By teacher", "by_size": "By model size"}


def section_title(name: str) -> str | None:
    """A table's section heading in report.md (a config axis's by_<axis>: "By <axis>")."""
    if name in SECTIONS:
        return SECTIONS[name]
    return f"By {name.removeprefix('by_')}" if name.startswith("by_") else None


def bench_section(record: dict, rel) -> list[str]:
    """The operator benchmark's ratio table and figures, or why there are none."""
    parts = ["## Operator benchmark (`linvit bench`)\n"]
    if record["status"] != "ok":
        return parts + [f"The benchmark job failed: {record.get('error', '')}\n"]
    run_dir = Path(record["run_dir"])
    m = record["metrics"]
    held = {True: "yes", False: "NO", None: "none measured (softmax only)"}[m["goals_hold"]]
    parts.append(f"Measured on {m['device']} with {m['threads']} threads; ratios are between "
                 f"rows of this one run. Goals hold: {held}.\n")
    ratios = "\n" + (run_dir / "ratios.md").read_text()
    parts.append(ratios.replace("\n## ", "\n### ").lstrip("\n"))      # nest its headings
    figures = [s for s in ("ops_scaling", "ops_share", "models_throughput")
               if (run_dir / f"{s}.png").is_file()]
    parts += [f"![{stem}]({rel(run_dir / stem)}.png)\n" for stem in figures]
    return parts


def claims_section(tables_dir: Path, figures: list[Path], rel, grid: Grid) -> list[str]:
    parts = ["## The paper's claims on this grid\n", method(grid),
             (tables_dir / "claims.md").read_text(),
             f"CSV and LaTeX: `{rel(tables_dir / 'claims')}.csv`, `.tex`\n"]
    return parts + [f"![claims]({rel(p)})\n" for p in figures if p.name == "claims.png"]


def cost_section(tables_dir: Path, rel) -> list[str]:
    from linvit.report.cost import METHOD as method

    return ["## Time to accuracy\n", method,
            (tables_dir / "time_to_target.md").read_text(),
            f"CSV and LaTeX: `{rel(tables_dir / 'time_to_target')}.csv`, `.tex`\n"]


def write_report(results: pd.DataFrame, tables_dir: Path, figures: list[Path], out: Path,
                 grid: Grid, title: str = "linvit ablation report",
                 bench: dict | None = None, robustness: Path | None = None,
                 dense: Path | None = None) -> None:
    out, tables, axes = Path(out), grid.tables, grid.axis_names
    rel = lambda p: os.path.relpath(p, out.parent)  # noqa: E731
    counts = results[results["kind"] == "cell"]["status"].value_counts().to_dict()
    parts = [f"# {title}\n",
             f"Cells: {sum(counts.values())} in the grid; " +
             ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ". Values: test top-1 (%) "
             "on each dataset's test split, mean ± 95% CI over seeds (a single seed shows the "
             "value alone).\n"]
    tables_dir = Path(tables_dir)
    shown = [n for n in SECTIONS if n in tables] + [n for n in tables if n not in SECTIONS
                                                    and section_title(n)]
    for name in shown:                   # the grid's tables: main, loss design, then by axis
        parts += [f"## {section_title(name)}\n", (tables_dir / f"{name}.md").read_text(),
                  f"CSV and LaTeX: `{rel(tables_dir / name)}.csv`, `.tex`\n"]
    if "claims" in tables:
        parts += claims_section(tables_dir, figures, rel, grid)
    if "time_to_target" in tables:
        parts += cost_section(tables_dir, rel)
    parts.append("## Figures\n")
    parts += [f"![{p.stem}]({rel(p)})\n" for p in figures
              if p.suffix == ".png" and p.stem != "claims"]
    # sections written beside report.md: their links hold here too
    parts += [Path(p).read_text() for p in (robustness, dense) if p is not None]
    if bench is not None:
        parts += bench_section(bench, rel)
    failed = results[results["status"].isin(["failed", "missing"])]
    if len(failed):
        parts.append("## Failed or missing jobs\n")
        parts += [f"- {job_name(r, axes)}: {r['status']}: {r['error']}"
                  for r in failed.to_dict("records")]
    write_text(out, "\n".join(parts) + "\n")


def job_name(row: dict, axes=()) -> str:
    """kind dataset/teacher/size/operator/init/loss/<axis>=<value>/seedN, leaving out what the
    job has not (a teacher has no operator, init, loss or seed of its own)."""
    parts = [str(row[k]) for k in ("dataset", "teacher", "size", "operator", "init", "loss")
             if not pd.isna(row.get(k))]
    parts += [f"{a}={row[a]}" for a in axes if not pd.isna(row.get(a))]
    seed = [] if pd.isna(row.get("seed")) else [f"seed{int(row['seed'])}"]
    return f"{row['kind']} " + "/".join(parts + seed)


def run_step(a) -> None:
    from linvit.report.files import read_csv
    from linvit.report.grid import read_grid

    bench = json.loads(Path(a.bench_record).read_text()) if a.bench_record else None
    grid = read_grid(a.grid)
    write_report(read_csv(a.results, grid), Path(a.tables), [Path(f) for f in a.figures],
                 Path(a.out), grid, bench=bench,
                 robustness=Path(a.robustness_section) if a.robustness_section else None,
                 dense=Path(a.dense_section) if a.dense_section else None)
