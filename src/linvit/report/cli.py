"""`python -m linvit.report.cli <step>`: the workflow's collection and reporting steps.

    record     write a job's record.json (status ok/failed) after its linvit run
    collect    records + grid.json -> results.csv, curves.csv, distill_layers.csv
    tables     results.csv -> tables/*.{csv,md,tex}
    figures    results/curves/distill_layers -> figures/*.{png,pdf}
    attention  teacher and distilled students -> figures/attention_maps.{png,pdf}
    report     tables + figures -> report.md

grid.json (written by the workflow) holds the expected cells, the axis orders and the main loss.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def _grid(path: str) -> dict:
    return json.loads(Path(path).read_text())


def _csv(path: str):
    import pandas as pd

    return pd.read_csv(path, keep_default_na=True)


def cmd_record(a) -> None:
    from linvit.report.record import write_record

    write_record(a.out, kind=a.kind, key=json.loads(a.key), run_dir=a.run_dir,
                 exit_status=a.status, log=a.log)


def cmd_collect(a) -> None:
    from linvit.report.collect import collect
    from linvit.report.record import read_records

    collect(read_records(a.records), _grid(a.grid)["cells"], a.out)


def cmd_tables(a) -> None:
    from linvit.report.tables import write_tables

    grid = _grid(a.grid)
    write_tables(_csv(a.results), grid["orders"], grid["main_loss"], a.out)


def cmd_figures(a) -> None:
    from linvit.report.figures import write_figures

    grid = _grid(a.grid)
    write_figures(_csv(a.results), _csv(a.curves), _csv(a.layers), grid["orders"],
                  grid["main_loss"], a.out)


def cmd_attention(a) -> None:
    from linvit.report.attention_maps import attention_figure

    students = dict(s.split("=", 1) for s in a.student)
    attention_figure(a.teacher, students, json.loads(a.data), a.layers, a.images, Path(a.out))


def cmd_report(a) -> None:
    from linvit.report.document import write_report

    write_report(_csv(a.results), Path(a.tables), [Path(f) for f in a.figures], Path(a.out),
                 _grid(a.grid)["main_loss"])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m linvit.report.cli", description=__doc__)
    sub = p.add_subparsers(dest="step", required=True)
    r = sub.add_parser("record")
    r.add_argument("--kind", required=True, choices=["teacher", "distill", "cell"])
    r.add_argument("--key", required=True, help="JSON object naming the job")
    r.add_argument("--run-dir", required=True)
    r.add_argument("--status", type=int, required=True, help="the linvit run's exit status")
    r.add_argument("--log")
    r.add_argument("--out", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--grid", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("records", nargs="*")
    t = sub.add_parser("tables")
    f = sub.add_parser("figures")
    d = sub.add_parser("report")
    for q in (t, f, d):
        q.add_argument("--grid", required=True)
        q.add_argument("--results", required=True)
        q.add_argument("--out", required=True)
    f.add_argument("--curves", required=True)
    f.add_argument("--layers", required=True)
    d.add_argument("--tables", required=True)
    d.add_argument("--figures", nargs="*", default=[])
    at = sub.add_parser("attention")
    at.add_argument("--teacher", required=True)
    at.add_argument("--student", action="append", default=[], help="NAME=model.safetensors")
    at.add_argument("--data", required=True, help="JSON data config (dataset, root, img_size)")
    at.add_argument("--layers", type=int, nargs="+", default=[0, -1])
    at.add_argument("--images", type=int, default=2)
    at.add_argument("--out", required=True, help="output path without extension")
    return p


COMMANDS = {"record": cmd_record, "collect": cmd_collect, "tables": cmd_tables,
            "figures": cmd_figures, "attention": cmd_attention, "report": cmd_report}


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    COMMANDS[args.step](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
