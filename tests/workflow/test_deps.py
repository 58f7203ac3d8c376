"""The code-dependency map and code stamps: editing a file reruns exactly the jobs that run it."""
from __future__ import annotations

import os
import re

import pytest

from linvit.attention import OPERATORS
from linvit.workflow import deps

from grid_configs import ROOT, default_config


def rel(paths):
    return {str(p.relative_to(deps.SRC_ROOT)) for p in paths}


def test_code_map_selects_registry_members():
    files = rel(deps.stage_sources("finetune", ["softmax", "focused"], [], ["fashion_mnist"]))
    assert {"linvit/attention/focused.py", "linvit/attention/softmax.py",
            "linvit/attention/base.py", "linvit/transfer/init.py", "linvit/train/loop.py",
            "linvit/data/fashion_mnist.py"} <= files
    assert not files & {"linvit/attention/linear.py", "linvit/attention/inline.py",
                        "linvit/data/cifar.py", "linvit/transfer/losses/attn_map_ce.py",
                        "linvit/report/figures.py"}
    distill = rel(deps.stage_sources("distill", ["softmax", "linear"], ["attn_map_ce"], []))
    assert "linvit/transfer/losses/attn_map_ce.py" in distill
    assert "linvit/transfer/losses/attn_out_mse.py" not in distill
    figures = rel(deps.stage_sources("figures"))
    assert "linvit/report/figures.py" in figures and not any("attention/" in f for f in figures)
    assert "linvit/report/figures.py" not in rel(deps.stage_sources("tables"))
    # computed once per selection, in any order, and each caller gets a list of its own
    again = deps.stage_sources("finetune", ("focused", "softmax"), (), {"fashion_mnist"})
    assert rel(again) == files
    again.clear()
    assert rel(deps.stage_sources("finetune", ["softmax", "focused"], [],
                                  ["fashion_mnist"])) == files


def test_a_code_stamp_lists_its_jobs_files_and_is_rewritten_only_when_they_change(
        tmp_path, monkeypatch):
    """A job's one code input: its files with their sha256; the same file for the same selection
    in any order, rewritten (a newer mtime, which reruns the job) when one of its files changes,
    left alone when another file does or nothing does."""
    import hashlib
    from functools import cache

    from linvit import code_digests

    def stamp(operators=("softmax", "focused")):
        deps.memoise_in(None)                           # a new workflow start
        return deps.code_stamp(tmp_path, "finetune", operators, [], ["fashion_mnist"])

    path = stamp()
    lines = path.read_text().splitlines()[1:]
    files = deps.stage_sources("finetune", ["softmax", "focused"], [], ["fashion_mnist"])
    # new: as old as its newest file (a lost .snakemake reruns nothing); the code as planned
    assert path.stat().st_mtime_ns == max(f.stat().st_mtime_ns for f in files)
    assert code_digests.digest_mismatches(path.read_text()) == []
    assert [line.split("  ")[1] for line in lines] == [str(f.relative_to(deps.SRC_ROOT))
                                                      for f in files]
    for line in lines:
        digest, name = line.split("  ")
        assert digest == hashlib.sha256((deps.SRC_ROOT / name).read_bytes()).hexdigest(), name
    os.utime(path, ns=(0, 0))
    assert stamp(["focused", "softmax", "focused"]) == path and path.stat().st_mtime_ns == 0
    digests = code_digests.file_digests()
    monkeypatch.setattr(code_digests, "file_digests", cache(
        lambda: {**digests, "linvit/attention/linear.py": "0" * 64}))
    assert stamp() == path and path.stat().st_mtime_ns == 0       # not one of its files
    monkeypatch.setattr(code_digests, "file_digests", cache(
        lambda: {**digests, "linvit/attention/focused.py": "0" * 64}))
    assert stamp() == path and path.stat().st_mtime_ns > 0
    assert f"{'0' * 64}  linvit/attention/focused.py" in path.read_text().splitlines()
    # a job planned with that stamp refuses to run the real focused.py
    assert code_digests.digest_mismatches(path.read_text()) == ["linvit/attention/focused.py"]
    other = stamp(["softmax", "linear"])
    assert other != path and other.parent != path.parent     # a folder each (_write_stamp: why)
    deps.memoise_in(None)


@pytest.mark.parametrize("swap", ["folder for a file", "file for a folder"])
def test_a_stamp_path_taken_by_something_else_fails_the_plan_naming_it(tmp_path, swap):
    # a dry run with --forceall must not plan without a job's code input: the start fails
    deps.memoise_in(None)
    path = deps.code_stamp(tmp_path, "finetune", ["softmax"], [], ["fashion_mnist"])
    deps.memoise_in(None)
    if swap == "folder for a file":
        path.unlink()
        path.mkdir()
    else:
        path.unlink()
        path.parent.rmdir()
        path.parent.write_text("not a folder")
    with pytest.raises(OSError, match=f"cannot write the code stamp {re.escape(str(path))}"):
        deps.code_stamp(tmp_path, "finetune", ["softmax"], [], ["fashion_mnist"])
    deps.memoise_in(None)


def test_operators_and_losses_each_have_their_own_file():
    members = deps.registry_members()
    for kind in ("operator", "loss"):
        assert len(set(members[kind].values())) == len(members[kind]), kind
    # entries sharing a file (cifar10/cifar100) keep it when either is selected
    assert "linvit/data/cifar.py" in rel(deps.stage_sources("finetune", datasets=["cifar100"]))


def test_a_workflow_start_with_stored_answers_does_not_import_torch(tmp_path):
    """What every Snakemake start evaluates, the config check and the code map, is read back from
    linvit.workflow.memo without importing the registries (and so torch) or parsing the package
    (~5 s per start), and the code map read back is the one the registries and the imports give."""
    import json
    import subprocess
    import sys
    (tmp_path / "config.json").write_text(json.dumps(default_config()))
    script = f"""
import json, sys
from pathlib import Path
from linvit.workflow import check, deps
parsed, parse = [], deps._imports
deps._imports = lambda path: parsed.append(path) or parse(path)
memo = Path({str(tmp_path / "memo")!r})
deps.memoise_in(memo)
check.check_config(json.loads(Path({str(tmp_path / "config.json")!r}).read_text()),
                  {str(ROOT / "Snakefile")!r}, memo)
files = deps.stage_sources("finetune", ["linear", "gla"], ["attn_map_ce"], ["fashion_mnist"])
print(json.dumps([sorted(m for m in ("torch", "linvit.attention") if m in sys.modules),
                  bool(parsed), deps.registry_names("operator"), [str(f) for f in files]]))
"""

    def start():
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(deps.SRC_ROOT)})
        assert run.returncode == 0, run.stderr[-3000:]
        return json.loads(run.stdout)

    imported, parsed, names, files = start()
    assert imported == ["linvit.attention", "torch"] and parsed and names == list(OPERATORS)
    assert files == [str(f) for f in deps.stage_sources("finetune", ["linear", "gla"],
                                                        ["attn_map_ce"], ["fashion_mnist"])]
    assert start() == [[], False, names, files]           # nothing imported, no file parsed
