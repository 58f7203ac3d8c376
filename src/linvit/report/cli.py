"""`python -m linvit.report.cli <step>`: the workflow's collection and reporting steps.

    record     write a job's record.json (status ok/failed) after its linvit run
    collect    records + grid.json -> results.csv, curves.csv, distill_layers.csv
    tables     results.csv, curves.csv -> tables/*.{csv,md,tex}
    figures    results/curves/distill_layers -> figures/*.{png,pdf}
    attention  attention-map records (linvit attention-maps) -> figures/attention_maps.{png,pdf}
    report     tables + figures -> report.md
    dense      results.csv -> tables/dense.*, figures/dense.*, dense.md
    robustness-report  robustness records -> tables/robustness.*, figures/robustness.*,
               robustness.md (a section of report.md)
    choose     the records of a choice's candidate settings -> the chosen one's YAML

grid.json (written by the workflow) holds the expected cells, the axis orders and the main loss.
"""
from __future__ import annotations

import argparse

from linvit.report.kinds import KINDS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m linvit.report.cli", description=__doc__)
    sub = p.add_subparsers(dest="step", required=True)
    r = sub.add_parser("record")
    r.add_argument("--kind", required=True, choices=KINDS)
    r.add_argument("--key", required=True, help="JSON object naming the job")
    r.add_argument("--run-dir", required=True)
    r.add_argument("--status", type=int, required=True, help="the linvit run's exit status")
    r.add_argument("--log")
    r.add_argument("--grid-results", help="the results folder of the grid that ran the job")
    r.add_argument("--command-digest", help="the digest of the job's linvit command")
    r.add_argument("--out", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--grid", help="grid.json: its key columns; its cells without a record appear "
                   "as missing")
    c.add_argument("--key-only", action="store_true",
                   help="take only the key from --grid (a sub-grid's records: the dense tasks)")
    c.add_argument("--out", required=True)
    c.add_argument("records", nargs="*")
    t = sub.add_parser("tables")
    f = sub.add_parser("figures")
    d = sub.add_parser("report")
    for q in (t, f, d):
        q.add_argument("--grid", required=True)
        q.add_argument("--results", required=True)
        q.add_argument("--out", required=True)
    for q in (t, f):
        q.add_argument("--curves", required=True)
    f.add_argument("--layers", required=True)
    t.add_argument("--layers", help="distill_layers.csv (the distillation-quality table)")
    d.add_argument("--tables", required=True)
    d.add_argument("--figures", nargs="*", default=[])
    d.add_argument("--bench-record", help="the bench job's record.json (a section of the report)")
    d.add_argument("--robustness-section", help="robustness.md (a section of the report)")
    d.add_argument("--dense-section", help="dense.md (a section of the report)")
    dn = sub.add_parser("dense")
    dn.add_argument("--grid", required=True)
    dn.add_argument("--results", required=True)
    dn.add_argument("--tables", required=True)
    dn.add_argument("--figures", required=True)
    dn.add_argument("--out", required=True)
    ro = sub.add_parser("robustness-report")
    ro.add_argument("--grid", required=True)
    ro.add_argument("--tables", required=True)
    ro.add_argument("--figures", required=True)
    ro.add_argument("--out", required=True, help="robustness.md, the report's section")
    ro.add_argument("records", nargs="*", help="record.json of every robustness job")
    ch = sub.add_parser("choose")
    ch.add_argument("--grid", required=True)
    ch.add_argument("--out", required=True, help="the chosen setting's YAML (a stage's -c)")
    ch.add_argument("records", nargs="+", help="record.json of every candidate of the choice")
    at = sub.add_parser("attention")
    at.add_argument("--teacher-record", required=True,
                    help="record.json of the maps job of the teacher")
    at.add_argument("--student-record", action="append", default=[],
                    help="NAME=record.json of the maps job of a distilled student")
    at.add_argument("--out", required=True, help="output path without extension")
    return p


# Each step lives in its own module and is imported only when it runs, so the workflow's
# code-dependency map (linvit.workflow.deps) ties a step to its module alone.
COMMANDS = {"record": "linvit.report.record", "collect": "linvit.report.collect",
            "tables": "linvit.report.tables", "figures": "linvit.report.figures",
            "attention": "linvit.report.attention_maps", "report": "linvit.report.document",
            "dense": "linvit.report.dense", "robustness-report": "linvit.report.robustness",
            "choose": "linvit.report.selection"}


def main(argv=None) -> int:
    import importlib
    import sys

    from linvit.errors import LinvitError

    args = build_parser().parse_args(argv)
    try:
        importlib.import_module(COMMANDS[args.step]).run_step(args)
    except LinvitError as e:             # result files it cannot use: one line, exit 2
        print(f"linvit report {args.step}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
