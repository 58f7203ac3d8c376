"""`linvit attention-maps` stores the maps the report's figure draws; the figure reads only them.

The stage's maps are checked against maps computed here by another path (timm's block sequence
by hand, the operator's forward_with_map), the figure against the stored files, and report/
against importing model, data or operator code (its imports, its code map, and a real run).
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from linvit import cli
from linvit.data import get_dataset
from linvit.models import load_model, save_model
from linvit.models.tensor_files import load_tensors
from linvit.report import attention_maps as figure
from linvit.report.record import KINDS, write_record
from linvit.workflow import deps

from conftest import make_model, one_error_line, perturb

REPORT = Path(__file__).resolve().parents[2] / "src" / "linvit" / "report"
# What reporting must not import: model, data and operator code, and torch itself.
FORBIDDEN = ("torch", "timm", "linvit.models", "linvit.data", "linvit.attention", "linvit.ops",
             "linvit.train", "linvit.transfer", "linvit.dense", "linvit.bench")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """A softmax teacher and a linear student of its size, with trained-looking weights."""
    from linvit.models import ModelSpec

    d = tmp_path_factory.mktemp("models")
    spec = ModelSpec("cpu96", "softmax", num_classes=10, img_size=28, in_chans=1)
    paths = {"teacher": d / "teacher.safetensors", "linear": d / "linear.safetensors",
             "wide": d / "wide.safetensors"}
    save_model(perturb(make_model(spec)), paths["teacher"])
    save_model(perturb(make_model(spec, "linear", seed=1), seed=2), paths["linear"])
    wide = ModelSpec("cpu192", "linear", num_classes=10, img_size=28, in_chans=1)
    save_model(make_model(wide), paths["wide"])
    return paths


def run_maps(out: Path, models: dict, mnist_root: Path, *extra: str) -> int:
    return cli.main(["attention-maps", "-o", str(out), f"teacher={models['teacher']}",
                     f"data.root={mnist_root}", "run.progress=false", *extra])


@pytest.fixture(scope="module")
def runs(tmp_path_factory, models, mnist_root) -> dict[str, Path]:
    """Maps of the teacher itself and of the linear student, layers [0, -1], 2 images."""
    d = tmp_path_factory.mktemp("maps")
    assert run_maps(d / "teacher", models, mnist_root) == 0
    assert run_maps(d / "linear", models, mnist_root, f"model={models['linear']}") == 0
    return {"teacher": d / "teacher", "linear": d / "linear"}


@torch.no_grad()
def expected_maps(teacher_path, model_path, mnist_root, layers, n) -> torch.Tensor:
    """(n, layers, N, N) by hand: the teacher's blocks run one by one, each attention's input
    taken as norm1 of the block input, and the model's per-head map from forward_with_map."""
    teacher, model = load_model(teacher_path).eval(), load_model(model_path).eval()
    loader = get_dataset("fashion_mnist").loader(str(mnist_root), "test", batch_size=n,
                                                 train=False)
    images, _ = next(loader.batches(0))
    x = teacher.norm_pre(teacher.patch_drop(teacher._pos_embed(teacher.patch_embed(images))))
    tokens = {}
    for l, block in enumerate(teacher.blocks):
        tokens[l] = block.norm1(x)
        x = block(x)
    return torch.stack([model.blocks[l].attn.forward_with_map(tokens[l])[1].mean(dim=1)
                        for l in layers], dim=1)


def test_the_stage_stores_the_head_mean_maps_on_the_teachers_tokens(runs, models, mnist_root):
    tensors, meta = load_tensors(runs["linear"] / "maps.safetensors")
    want = expected_maps(models["teacher"], models["linear"], mnist_root, [0, 5], 2)
    assert tensors["maps"].dtype == torch.float32 and tensors["maps"].shape == (2, 2, 50, 50)
    torch.testing.assert_close(tensors["maps"], want, rtol=1e-5, atol=1e-6)
    assert (json.loads(meta["layers"]), meta["operator"]) == ([0, 5], "linear")
    assert (meta["model"], meta["teacher"]) == (str(models["linear"]), str(models["teacher"]))
    metrics = json.loads((runs["linear"] / "metrics.json").read_text())
    assert (metrics["layers"], metrics["images"], metrics["operator"]) == ([0, 5], 2, "linear")
    assert "maps.safetensors" in metrics["outputs"]


def test_without_a_model_the_maps_are_the_teachers_own(runs, models, mnist_root):
    tensors, meta = load_tensors(runs["teacher"] / "maps.safetensors")
    want = expected_maps(models["teacher"], models["teacher"], mnist_root, [0, 5], 2)
    torch.testing.assert_close(tensors["maps"], want, rtol=1e-5, atol=1e-6)
    assert meta["operator"] == "softmax" and meta["model"] == str(models["teacher"])
    # the student's maps are not the teacher's: the two files differ where it matters
    student = load_tensors(runs["linear"] / "maps.safetensors")[0]["maps"]
    assert (student - tensors["maps"]).abs().max() > 1e-3


def test_layers_and_images_are_chosen_and_resolved(models, mnist_root, tmp_path):
    assert run_maps(tmp_path / "m", models, mnist_root, f"model={models['linear']}",
                    "layers=[-2, 1]", "images=3") == 0
    tensors, meta = load_tensors(tmp_path / "m" / "maps.safetensors")
    want = expected_maps(models["teacher"], models["linear"], mnist_root, [4, 1], 3)
    torch.testing.assert_close(tensors["maps"], want, rtol=1e-5, atol=1e-6)
    assert json.loads(meta["layers"]) == [4, 1]


@pytest.mark.parametrize("extra, message", [
    (["layers=[6]"], "layers: [6] outside -6..5 (the teacher has 6 blocks)"),
    (["layers=[0, -6]"], "name the same block twice"),
    (["layers=[]"], "layers: name at least one block"),
    (["images=0"], "images: must be > 0"),
    (["images=257"], "images: 257, but the test split of 'fashion_mnist' gives 256"),
    (["model=WIDE"], "its attention cannot take the teacher's tokens"),
    (["model=missing.safetensors"], "model: file not found"),
])
def test_bad_input_is_refused_before_anything_is_written(models, mnist_root, tmp_path, capsys,
                                                         extra, message):
    extra = [e.replace("WIDE", str(models["wide"])) for e in extra]
    out = tmp_path / "out"
    assert run_maps(out, models, mnist_root, *extra) == 2
    assert message in one_error_line(capsys, "attention-maps")
    assert not out.exists()


def maps_record(run_dir: Path, out: Path, status: int = 0) -> Path:
    write_record(out, kind="maps", key={"model": run_dir.name}, run_dir=run_dir,
                 exit_status=status)
    return out


def test_the_figure_draws_the_stored_maps(runs, tmp_path, monkeypatch):
    drawn = {}
    real_draw = figure.draw

    def spy(panels, layers, out):
        drawn.update(panels=panels, layers=layers)
        real_draw(panels, layers, out)

    monkeypatch.setattr(figure, "draw", spy)
    teacher = maps_record(runs["teacher"], tmp_path / "t.json")
    student = maps_record(runs["linear"], tmp_path / "s.json")
    failed = maps_record(tmp_path / "nothing", tmp_path / "f.json", status=2)
    figure.attention_figure_from_records(str(teacher), {"linear": str(student),
                                                        "focused": str(failed)},
                                         tmp_path / "fig")
    assert list(drawn["panels"]) == ["softmax teacher", "linear (distilled)"]   # failed: left out
    assert drawn["layers"] == [0, 5]
    for name, run in (("softmax teacher", "teacher"), ("linear (distilled)", "linear")):
        stored = load_tensors(runs[run] / "maps.safetensors")[0]["maps"].numpy()
        assert (drawn["panels"][name] == stored).all(), name
    assert (tmp_path / "fig.png").stat().st_size > 0 and (tmp_path / "fig.pdf").is_file()


def test_a_failed_teacher_gives_a_figure_that_says_so(tmp_path, monkeypatch):
    said = []
    monkeypatch.setattr(figure, "draw_failed", lambda error, out: said.append(error))
    teacher = maps_record(tmp_path / "nothing", tmp_path / "t.json", status=2)
    figure.attention_figure_from_records(str(teacher), {}, tmp_path / "fig")
    assert said == ["exit status 2, no log"]
    monkeypatch.undo()
    figure.attention_figure_from_records(str(teacher), {}, tmp_path / "fig")
    assert (tmp_path / "fig.png").stat().st_size > 0


def test_the_figure_refuses_changed_maps_and_records_of_other_jobs(runs, tmp_path):
    teacher = maps_record(runs["teacher"], tmp_path / "t.json")
    other = json.loads(teacher.read_text()) | {"kind": "distill"}
    (tmp_path / "d.json").write_text(json.dumps(other))
    with pytest.raises(ValueError, match="not records of attention-maps jobs"):
        figure.attention_figure_from_records(str(tmp_path / "d.json"), {}, tmp_path / "fig")
    record = json.loads(teacher.read_text())
    record["metrics"]["outputs"]["maps.safetensors"] = "0" * 64
    teacher.write_text(json.dumps(record))
    with pytest.raises(ValueError, match="changed since its job recorded it"):
        figure.attention_figure_from_records(str(teacher), {}, tmp_path / "fig")


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_reporting_imports_no_model_data_or_operator_code():
    files = sorted(REPORT.glob("*.py"))
    assert REPORT / "attention_maps.py" in files
    bad = {f.name: sorted(n for n in imported_modules(f)
                          if any(n == m or n.startswith(m + ".") for m in FORBIDDEN))
           for f in files}
    assert {name: names for name, names in bad.items() if names} == {}
    # the figure's whole code map (what reruns it) holds none of it either
    step = {str(p.relative_to(deps.SRC_ROOT)) for p in deps.stage_sources("attention")}
    assert "linvit/report/attention_maps.py" in step
    assert not [f for f in step if f.split("/")[1] in ("models", "data", "attention", "ops")]


def test_drawing_the_figure_loads_no_torch(runs, tmp_path):
    teacher = maps_record(runs["teacher"], tmp_path / "t.json")
    student = maps_record(runs["linear"], tmp_path / "s.json")
    code = ("import sys; from linvit.report.cli import main; "
            f"main(['attention', '--teacher-record', {str(teacher)!r}, "
            f"'--student-record', 'linear=' + {str(student)!r}, '--out', {str(tmp_path / 'f')!r}]);"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'timm') "
            "or m.startswith(('linvit.models', 'linvit.data', 'linvit.attention'))))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]"
    assert (tmp_path / "f.png").stat().st_size > 0


def test_maps_is_a_record_kind_and_the_cli_offers_every_kind(tmp_path):
    from linvit.report.cli import build_parser

    record = build_parser()._subparsers._group_actions[0].choices["record"]
    kind = next(a for a in record._actions if a.dest == "kind")
    assert tuple(kind.choices) == KINDS and "maps" in KINDS
    with pytest.raises(ValueError, match="record kind 'map' is not one of"):
        write_record(tmp_path / "r.json", kind="map", key={}, run_dir=tmp_path, exit_status=0)


def test_collection_tolerates_a_maps_record(runs, tmp_path):
    """The workflow never passes one to collect; if one got there it is a row of its own kind,
    which no table reads."""
    from linvit.report.collect import collect

    record = json.loads(maps_record(runs["linear"], tmp_path / "m.json").read_text())
    paths = collect([record], None, tmp_path)
    assert pd.read_csv(paths["results"])["kind"].tolist() == ["maps"]
