"""linvit's Python API (linvit.api): the same tensors as the stages, docs/api.md's example run as
written, and bad options refused before any compute."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import linvit
from linvit.config import load_config
from linvit.errors import ConfigError
from linvit.io import read_json
from linvit.models import ModelSpec, create_vit, save_model
from linvit.transfer.config import DistillConfig, FinetuneConfig
from linvit.transfer.stages import run_distill, run_finetune

from conftest import perturb

DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"
COMMON = ["data.batch_size=64", "data.eval_batch_size=128", "run.progress=false",
          "run.threads=1", "run.amp=float32", "run.loggers=[]"]


@pytest.fixture(scope="module")
def teacher_file(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("teacher") / "model.safetensors"
    save_model(perturb(create_vit(ModelSpec("cpu64", "softmax", 10, 28, 1))), path)
    return path


def test_convert_gives_the_tensors_of_the_distill_and_finetune_stages(mnist_root, teacher_file,
                                                                     tmp_path):
    """The API and the stages share their loops: the same seed, data and options give the same
    distilled student, the same init record and, after fine-tuning, the same tensors."""
    stage = ["model.operator=gla", f"data.root={mnist_root}", *COMMON]
    run_distill(load_config(DistillConfig, None, [f"teacher={teacher_file}", "optim.epochs=2",
                                                  *stage]), tmp_path / "distill")
    run_finetune(load_config(FinetuneConfig, None, [
        f"teacher={teacher_file}", f"distilled={tmp_path / 'distill' / 'model.safetensors'}",
        "init.strategy=copy_mlp+distill", "optim.epochs=2", "optim.warmup_epochs=1", *stage]),
        tmp_path / "finetune")
    student = linvit.convert(teacher_file, operator="gla", strategy="copy_mlp+distill",
                             data="fashion_mnist",
                             data_options={"root": str(mnist_root), "batch_size": 64},
                             distill={"epochs": 2}, finetune={"epochs": 2, "warmup_epochs": 1},
                             device="cpu", seed=0)
    expected = load_file(tmp_path / "finetune" / "model.safetensors")
    state = student.state_dict()
    assert sorted(state) == sorted(expected)
    assert [k for k in expected if not torch.equal(state[k], expected[k])] == []
    assert student.conversion["init"]["tensors"] == \
        read_json(tmp_path / "finetune" / "copied.json")["tensors"]
    stage_history = [r["train_loss"] for r in
                     map(read_json_line, (tmp_path / "distill" / "train.jsonl").read_text()
                         .splitlines())]
    assert [r["train_loss"] for r in student.conversion["distill"]] == stage_history
    assert len(student.conversion["finetune"]) == 2


def read_json_line(line: str) -> dict:
    import json
    return json.loads(line)


def doc_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def test_the_example_in_docs_api_runs_as_written(mnist_root, tmp_path, monkeypatch, capsys):
    blocks = doc_blocks()
    assert len(blocks) == 2
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "fashion_mnist").symlink_to(mnist_root)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)       # noqa: S102 (our own docs)
    student, own = namespace["student"], namespace["own"]
    assert student.spec.operator == "gla" and own.spec.operator == "linear"
    assert len(student.conversion["distill"]) == 2 == len(student.conversion["finetune"])
    assert len(namespace["history"]) == 2
    assert "top-1" in capsys.readouterr().out


def test_distill_trains_only_the_attention_and_finetune_every_tensor(teacher_file):
    from torch.utils.data import DataLoader, TensorDataset

    from linvit.models import load_model

    teacher = load_model(teacher_file)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(128, 1, 28, 28, generator=g),
                         torch.randint(0, 10, (128,), generator=g))
    train = DataLoader(data, batch_size=32, shuffle=True, drop_last=True)
    torch.manual_seed(1)
    student = create_vit(teacher.spec.derive(operator="linear"))
    before = {k: v.clone() for k, v in student.state_dict().items()}
    history = linvit.distill(student, teacher, train, epochs=1)
    moved = {k.split(".")[2] for k, v in student.state_dict().items()
             if k.startswith("blocks.") and not torch.equal(v, before[k])}
    assert moved == {"attn"} and "train_attn_out_mse/L0" in history[0]
    assert all(p.requires_grad for p in student.parameters())    # nothing left frozen
    assert not any(not torch.equal(v, before[k]) for k, v in student.state_dict().items()
                   if not k.startswith("blocks."))
    linvit.finetune(student, train, epochs=1, warmup_epochs=0)
    after = student.state_dict()
    assert {k.split(".")[0] for k in after if not torch.equal(after[k], before[k])} >= {
        "blocks", "head", "patch_embed"}


@pytest.mark.parametrize("call, words", [
    (lambda t: linvit.convert(t, distill={"epochz": 2}), "distill.epochz: unknown option"),
    (lambda t: linvit.convert(t, operator="gla", distill={"losses": {"attn_map_ce": 1.0}}),
     "distill.losses: attn_map_ce"),
    (lambda t: linvit.convert(t, finetune={"lr": -1.0}), "finetune.lr"),
    (lambda t: linvit.convert(t, operator="nope"), "nope"),
    (lambda t: linvit.convert(t, strategy="copy_every"), "strategy.strategy"),
    (lambda t: linvit.convert(t, operator="softmax", strategy="attn_copy"), "attaches"),
    (lambda t: linvit.convert(t, data=42), "data: a dataset name"),
    (lambda t: linvit.convert(create_vit(ModelSpec("cpu64", "linear", 10, 28, 1))),
     "a softmax model"),
    (lambda t: linvit.convert(torch.nn.Linear(2, 2)), "a linvit model or model file"),
])
def test_bad_options_are_refused_before_any_compute(teacher_file, call, words, monkeypatch):
    from linvit.transfer import loops

    def no_compute(*args, **kwargs):
        raise AssertionError("a loop ran before the options were checked")

    monkeypatch.setattr(loops, "fit", no_compute)
    monkeypatch.setattr("linvit.runs.evaluation.make_loaders", no_compute)
    with pytest.raises(ConfigError, match=re.escape(words)):
        call(teacher_file)
