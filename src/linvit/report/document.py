"""results/report.md: the tables, the figures, the paper's claims checked on this grid, failures.

The claims section states each claim of arXiv 2609.35745 with the test applied to this grid's
means and the verdict, so a claim that does not reproduce here says so.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from linvit.io import write_text

CLAIMS = [
    ("Copying attention weights barely helps: copy_attn gains less over copy_embed than "
     "copy_mlp does", lambda m: m["copy_attn"] - m["copy_embed"] < m["copy_mlp"] - m["copy_embed"],
     ("copy_embed", "copy_attn", "copy_mlp")),
    ("MLPs carry most of the benefit of pretraining: "
     "(copy_mlp - random) >= 0.5 (copy_all - random)",
     lambda m: m["copy_mlp"] - m["random"] >= 0.5 * (m["copy_all"] - m["random"]),
     ("random", "copy_mlp", "copy_all")),
    ("Distilled attention beats random attention: distill > random",
     lambda m: m["distill"] > m["random"], ("random", "distill")),
    ("Copy MLP + distill attention closes the rest of the gap: copy_mlp+distill >= copy_all",
     lambda m: m["copy_mlp+distill"] >= m["copy_all"], ("copy_all", "copy_mlp+distill")),
    ("Copy MLP + distill attention can match the softmax ViT: copy_mlp+distill >= softmax "
     "given the same fine-tuning (copy_all)",
     lambda m: m["copy_mlp+distill"] >= m["softmax"], ("copy_mlp+distill", "softmax")),
]


def strategy_means(results: pd.DataFrame, main_loss: str) -> dict[tuple, dict[str, float]]:
    """(dataset / teacher / size, operator) -> init strategy -> mean top-1; 'softmax' holds the
    softmax reference fine-tuned with copy_all."""
    ok = results[(results["kind"] == "cell") & (results["status"] == "ok")
                 & results["loss"].isin([main_loss, "none"])]
    means = ok.groupby(["dataset", "teacher", "size", "operator", "init"], dropna=False)["top1"]
    out: dict[tuple, dict[str, float]] = {}
    for (*group, op, init), value in means.mean().items():
        where = " / ".join(str(v) for v in group if not pd.isna(v))
        out.setdefault((where, op), {})[init] = float(value)
    for (where, _op), row in out.items():
        ref = out.get((where, "softmax"), {}).get("copy_all")
        if ref is not None:
            row["softmax"] = ref
    return {k: v for k, v in out.items() if k[1] != "softmax"}


def claims_table(results: pd.DataFrame, main_loss: str) -> str:
    lines = ["| claim | dataset / teacher / size | operator | numbers | verdict |",
             "|---|---|---|---|---|"]
    for (where, op), m in strategy_means(results, main_loss).items():
        for text, test, needed in CLAIMS:
            if all(k in m for k in needed):
                numbers = ", ".join(f"{k} {m[k]:.2f}" for k in needed)
                verdict = "holds" if test(m) else "**does not hold**"
            else:
                numbers, verdict = "cells not in this grid or failed", "not tested"
            lines.append(f"| {text} | {where} | {op} | {numbers} | {verdict} |")
    return "\n".join(lines) + "\n"


def bench_section(record: dict, rel) -> list[str]:
    """The operator benchmark's ratio table and figures, or why there are none."""
    parts = ["## Operator benchmark (`linvit bench`)\n"]
    if record["status"] != "ok":
        return parts + [f"The benchmark job failed: {record.get('error', '')}\n"]
    run_dir = Path(record["run_dir"])
    m = record["metrics"]
    parts.append(f"Measured on {m['device']} with {m['threads']} threads; ratios are between "
                 "rows of this one run. Goals hold: "
                 f"{'yes' if m['goals_hold'] else 'NO'}.\n")
    ratios = "\n" + (run_dir / "ratios.md").read_text()
    parts.append(ratios.replace("\n## ", "\n### ").lstrip("\n"))      # nest its headings
    figures = [s for s in ("ops_scaling", "models_throughput") if (run_dir / f"{s}.png").is_file()]
    parts += [f"![{stem}]({rel(run_dir / stem)}.png)\n" for stem in figures]
    return parts


def write_report(results: pd.DataFrame, tables_dir: Path, figures: list[Path], out: Path,
                 main_loss: str, title: str = "linvit ablation report",
                 bench: dict | None = None, robustness: Path | None = None,
                 dense: Path | None = None) -> None:
    out = Path(out)
    rel = lambda p: os.path.relpath(p, out.parent)  # noqa: E731
    counts = results[results["kind"] == "cell"]["status"].value_counts().to_dict()
    parts = [f"# {title}\n",
             f"Cells: {sum(counts.values())} in the grid; " +
             ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ". Values: test top-1 (%) "
             "on each dataset's test split, mean ± 95% CI over seeds (a single seed shows the "
             "value alone).\n"]
    sections = [("Main table", "main"), ("Loss design", "loss_design"),
                ("By dataset", "by_dataset"), ("By teacher", "by_teacher"),
                ("By model size", "by_size")]
    for heading, name in sections:
        parts += [f"## {heading}\n", (Path(tables_dir) / f"{name}.md").read_text(),
                  f"CSV and LaTeX: `{rel(Path(tables_dir) / name)}.csv`, `.tex`\n"]
    parts += ["## The paper's claims on this grid\n", claims_table(results, main_loss)]
    parts.append("## Figures\n")
    parts += [f"![{p.stem}]({rel(p)})\n" for p in figures if p.suffix == ".png"]
    # sections written beside report.md: their links hold here too
    parts += [Path(p).read_text() for p in (robustness, dense) if p is not None]
    if bench is not None:
        parts += bench_section(bench, rel)
    failed = results[results["status"].isin(["failed", "missing"])]
    if len(failed):
        parts.append("## Failed or missing jobs\n")
        parts += [f"- {job_name(r)}: {r.status}: {r.error}" for r in failed.itertuples()]
    write_text(out, "\n".join(parts) + "\n")


def job_name(row) -> str:
    """kind dataset/teacher/size/operator/init/loss/seedN, leaving out what the job has not (a
    teacher has no operator, init, loss or seed of its own)."""
    parts = [str(v) for v in (row.dataset, row.teacher, row.size, row.operator, row.init,
                              row.loss) if not pd.isna(v)]
    seed = [] if pd.isna(row.seed) else [f"seed{int(row.seed)}"]
    return f"{row.kind} " + "/".join(parts + seed)


def run_step(a) -> None:
    from linvit.report.files import read_csv, read_grid

    bench = json.loads(Path(a.bench_record).read_text()) if a.bench_record else None
    write_report(read_csv(a.results), Path(a.tables), [Path(f) for f in a.figures], Path(a.out),
                 read_grid(a.grid)["main_loss"], bench=bench,
                 robustness=Path(a.robustness_section) if a.robustness_section else None,
                 dense=Path(a.dense_section) if a.dense_section else None)
