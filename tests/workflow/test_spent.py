"""What grids spent (linvit.workflow.spent): Snakemake's benchmark files summed by grid and job
kind, a job two grids share (one jobs folder) counted once, under the first grid."""
from __future__ import annotations

from pathlib import Path

from linvit.workflow.plan import plan
from linvit.workflow.spent import markdown, spent

from grid_configs import default_config


def write_benchmark(path: str, cpu: float, wall: float) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("s\th:m:s\tmax_rss\tcpu_time\n"
                          f"{wall}\t0:00:01\t1.0\t{cpu}\n")


def test_shared_jobs_are_counted_once_and_unmeasured_ones_are_said(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = {**default_config(), "results": "a", "jobs_folder": "jobs"}
    b = {**a, "results": "b"}
    jobs = plan(a)
    teacher, cells = jobs.of("teacher")[0], jobs.of("cell")[:3]
    write_benchmark(teacher.benchmark, 100.0, 60.0)
    for i, cell in enumerate(cells):
        write_benchmark(cell.benchmark, 10.0 + i, 5.0)
    rows = {(r["grid"], r["kind"]): r for r in spent({"a": a, "b": b})}
    assert rows["a", "teacher"] == {"grid": "a", "kind": "teacher", "jobs": 1, "measured": 1,
                                    "cpu_s": 100.0, "wall_s": 60.0}
    assert rows["a", "cell"]["measured"] == 3 and rows["a", "cell"]["cpu_s"] == 33.0
    assert rows["a", "cell"]["jobs"] == len(jobs.of("cell"))
    own = {j.kind.name for j in plan(b).jobs if j.benchmark and not j.kind.shared}
    assert {k for g, k in rows if g == "b"} == own and "cell" not in own   # b's own: maps, ...
    text = markdown(list(rows.values()), cores=2)
    assert "**133**" in text and "0 h 01 min of 2 busy cores" in text
