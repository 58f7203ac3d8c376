"""The report's tables: mean and CI per cell, missing and failed cells, teachers side by side."""
from __future__ import annotations

import pandas as pd
import pytest

from linvit.render.tables import summarize, to_latex, to_markdown
from linvit.report.collect import results_frame
from linvit.report.grid import Grid
from linvit.report.tables import format_cell, main_table
from markdown_rows import has_row


def record(kind, key, top1=None, status="ok"):
    metrics = {"top1": top1, "top5": 99.0, "loss": 0.5, "train_time_s": 10.0, "epochs": 1}
    return {"kind": kind, "key": key, "run_dir": "x", "status": status,
            "metrics": metrics if status == "ok" else {}, "config": {"optim": {"lr": 0.001}},
            "error": "" if status == "ok" else "boom"}


def test_ci_and_cell_formatting():
    mean, ci, n = summarize([70.0, 72.0, 74.0])
    assert (mean, n) == (72.0, 3) and ci == pytest.approx(4.302653 * 2 / 3 ** 0.5)
    # 12 values: t(0.975, 11) = 2.200985, not a table's neighbouring entry (2.228 at 10 dof)
    _, ci12, _ = summarize([0.0, 1.0] * 6)
    assert ci12 == pytest.approx(2.200985 * (12 / 11 * 0.25) ** 0.5 / 12 ** 0.5)
    frame = pd.DataFrame({"status": ["ok", "ok", "failed"], "top1": [70.0, 72.0, None]})
    assert format_cell(frame) == "71.00 ± 12.71 (2/3 seeds)"
    assert format_cell(pd.DataFrame({"status": ["failed"], "top1": [None]})) == "failed"
    assert format_cell(pd.DataFrame({"status": ["missing"], "top1": [None]})) == "missing"


def test_tables_show_missing_and_failed_cells_and_match_known_output():
    cells = [{"dataset": "d", "teacher": "t", "size": "s", "operator": op, "init": init,
              "loss": "none", "seed": 0}
             for op in ("linear", "focused") for init in ("random", "copy_mlp")]
    records = [record("teacher", {"dataset": "d", "teacher": "t", "size": "s"}, 80.0),
               record("cell", cells[0], 61.5), record("cell", cells[1], 70.25),
               record("cell", cells[2], status="failed")]
    results = results_frame(records, Grid(cells, "out", {}, []))
    assert list(results["status"]) == ["ok", "ok", "ok", "failed", "missing"]
    assert results.loc[1, "config.optim.lr"] == 0.001           # every row carries its config
    orders = {"init": ["random", "copy_mlp"], "operator": ["linear", "focused", "softmax"]}
    table = main_table(results, Grid([], "out", orders, []))
    assert to_markdown(table) == (
        "| dataset   | teacher   | size   | init                 |   linear |   focused |   softmax |\n"  # noqa: E501
        "|:----------|:----------|:-------|:---------------------|---------:|----------:|----------:|\n"  # noqa: E501
        "| d         | t         | s      | teacher (pretrained) |          |           |     80.00 |\n"  # noqa: E501
        "| d         | t         | s      | random               |    61.50 |    failed |           |\n"  # noqa: E501
        "| d         | t         | s      | copy_mlp             |    70.25 |   missing |           |\n")  # noqa: E501
    latex = to_latex(table, "Top-1 & more")
    assert r"\caption{Top-1 \& more}" in latex
    assert r"d & t & s & random & 61.50 & failed &  \\" in latex


def test_latex_and_markdown_escape_every_special_character():
    """Axis values are the user's: LaTeX's ten specials in a cell, a header and the caption come
    out escaped, ± as math; a pipe in a Markdown cell does not split it."""
    table = pd.DataFrame({"top_1": ["71.00 ± 1.20", "a|b"]},
                         index=pd.Index(["lr=$1{e}~^", "50%&#"], name="cfg\\x"))
    latex = to_latex(table, "cost ~ $ {x} ^ 2")
    assert r"\caption{cost \textasciitilde{} \$ \{x\} \textasciicircum{} 2}" in latex
    assert r"cfg\textbackslash x & top\_1 \\" in latex
    assert r"lr=\$1\{e\}\textasciitilde \textasciicircum  & 71.00 $\pm$ 1.20 \\" in latex
    assert r"50\%\&\# & a|b \\" in latex
    assert r" a\|b |" in to_markdown(table)


def test_by_teacher_table_puts_teachers_side_by_side():
    from linvit.report.tables import axis_table
    records = [record("cell", {"dataset": "d", "teacher": t, "size": "s", "operator": "linear",
                               "init": "copy_mlp", "loss": "none", "seed": seed}, top1)
               for t, seed, top1 in [("sup", 0, 70.0), ("sup", 1, 72.0), ("ssl", 0, 60.0)]]
    records.append(record("teacher", {"dataset": "d", "teacher": "ssl", "size": "s",
                                      "stage": "select"}, 50.0))
    results = results_frame(records)
    orders = {"teacher": ["sup", "ssl"], "init": ["copy_mlp"], "operator": ["linear"]}
    table = axis_table(results, Grid([], "out", orders, []), "teacher")
    assert list(table.columns) == ["sup", "ssl"]
    assert table.columns.name == "teacher"   # what names a clashing value column in the writers
    assert table.loc[("d", "s", "linear", "copy_mlp"), "ssl"] == "60.00"
    assert table.loc[("d", "s", "linear", "copy_mlp"), "sup"].startswith("71.00")
    main = main_table(results, Grid([], "out", orders, []))
    assert ("d", "ssl", "s", "teacher (selected)") in main.index


def test_a_value_column_named_like_an_index_level_is_named_by_its_axis(tmp_path):
    """attn_start's values (random, teacher) as columns beside the teacher axis: every writer
    keeps both, the clashing value column as "attn_start=teacher"."""
    from linvit.render.tables import write_table

    table = pd.DataFrame([["1.00", "2.00"]], index=pd.Index(["sup"], name="teacher"),
                         columns=pd.Index(["random", "teacher"], name="attn_start"))
    write_table(table, tmp_path / "t", "by attn_start")
    assert (tmp_path / "t.csv").read_text().splitlines()[0] == \
        "teacher,random,attn_start=teacher"
    assert has_row((tmp_path / "t.md").read_text(), "sup", "1.00", "2.00")
    assert r"teacher & random & attn\_start=teacher" in (tmp_path / "t.tex").read_text()
