"""Run folders: nothing of the user's is deleted, a result is complete only when verified, a
damaged checkpoint is refused (and --rerun recovers), one writer per folder."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, safe_open, save_file

from linvit import cli
from linvit.io import file_mode, read_json
from linvit.models import ModelSpec, create_vit, save_model
from linvit.report.record import make_record
from linvit.runs import rundir
from linvit.runs.rundir import LOCK, MARKER, verified_metrics
from linvit.runs.verify import check_run

from conftest import one_error_line


@pytest.fixture(scope="module")
def teacher_file(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("teacher") / "model.safetensors"
    save_model(create_vit(ModelSpec("cpu96", "softmax", 10, 28, 1)), path)
    return path


def snapshot(root: Path) -> dict:
    """Every file and folder under root with its bytes' hash and modification time."""
    out = {}
    for p in sorted(root.rglob("*")):
        data = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        out[str(p.relative_to(root))] = (data, p.stat().st_mtime_ns)
    return out


def evaluate(out, teacher, mnist_root, *extra) -> int:
    return cli.main(["evaluate", "-o", str(out), f"checkpoint={teacher}", f"data.root={mnist_root}",
                     "run.progress=false", *extra])


@pytest.mark.parametrize("rerun", [[], ["--rerun"]], ids=["plain", "rerun"])
@pytest.mark.parametrize("target, message", [
    ("", "empty path"), (".", "current directory"), ("..", "current directory"),
    ("afile", "not a folder"), ("afile/sub", "not a writable folder"),
    ("foreign", "was not made by linvit"), ("work/keep", "was not made by linvit"),
])
def test_an_output_folder_linvit_did_not_make_is_refused_untouched(
        target, message, rerun, tmp_path, monkeypatch, capsys, teacher_file, mnist_root):
    work = tmp_path / "work"
    (work / "keep").mkdir(parents=True)
    (work / "keep" / "notes.txt").write_text("the user's")
    (work / "sentinel").write_text("the user's")
    (tmp_path / "afile").write_text("the user's")
    (tmp_path / "foreign").mkdir()                 # looks like an old run, but not linvit's
    (tmp_path / "foreign" / "config.yaml").write_text("stage: evaluate\n")
    monkeypatch.chdir(work)
    out = target if target in ("", ".", "..") else str(tmp_path / target)
    before = snapshot(tmp_path)
    assert evaluate(out, teacher_file, mnist_root, *rerun) == 2
    assert message in one_error_line(capsys, "evaluate")
    assert snapshot(tmp_path) == before


def test_rerun_replaces_only_what_linvit_wrote(tmp_path, capsys, teacher_file, mnist_root):
    out = tmp_path / "run"
    assert evaluate(out, teacher_file, mnist_root) == 0
    (out / "notes.txt").write_text("the user's")
    (out / "mine").mkdir()
    (out / "mine" / "data.bin").write_bytes(b"\x00\x01")
    (tmp_path / "victim.txt").write_text("the user's")
    marker = read_json(out / MARKER)                       # a marker edited to reach further
    marker["files"] += ["../victim.txt", "notes.txt", "mine"]
    (out / MARKER).write_text(json.dumps(marker))
    capsys.readouterr()
    before = snapshot(out)
    # another config without --rerun: refused, nothing touched
    assert evaluate(out, teacher_file, mnist_root, "data.eval_batch_size=64") == 2
    assert "another config" in one_error_line(capsys, "evaluate")
    assert snapshot(out) == before
    assert evaluate(out, teacher_file, mnist_root, "data.eval_batch_size=64", "--rerun") == 0
    assert (out / "notes.txt").read_text() == "the user's"
    assert (out / "mine" / "data.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "victim.txt").read_text() == "the user's"
    assert read_json(out / "metrics.json")["eval_samples"] == 256
    assert "eval_batch_size: 64" in (out / "config.yaml").read_text()
    assert sorted(read_json(out / MARKER)["files"]) == sorted(rundir.owned_names("evaluate"))


def pretrain(out, mnist_root, *extra) -> int:
    return cli.main(["pretrain", "-o", str(out), f"data.root={mnist_root}", "data.batch_size=64",
                     "data.train_subset=128", "data.test_subset=64", "optim.epochs=2",
                     "optim.warmup_epochs=0", "run.progress=false", *extra])


@pytest.fixture
def interrupted(tmp_path, mnist_root, monkeypatch) -> Path:
    """A pretraining run stopped after its last epoch's checkpoint, before its results."""
    def stop(self, metrics):
        raise KeyboardInterrupt
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setattr(rundir.RunDir, "finish", stop)
        with pytest.raises(KeyboardInterrupt):
            pretrain(out, mnist_root)
    rundir.RunDir(out, "pretrain", {}).release()      # as the end of that process would
    assert (out / "checkpoint.safetensors").is_file() and not (out / "metrics.json").exists()
    return out


def zero_one_tensor(path: Path) -> None:
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    tensors = load_file(str(path))
    name = next(k for k in sorted(tensors) if k.endswith("qkv.weight"))
    tensors[name] = torch.zeros_like(tensors[name])
    save_file(tensors, str(path), metadata=meta)         # the old checksum stays


@pytest.mark.parametrize("damage", ["zeroed tensor", "truncated"])
def test_a_damaged_checkpoint_is_refused_and_rerun_recovers(damage, interrupted, mnist_root,
                                                           capsys):
    ckpt = interrupted / "checkpoint.safetensors"
    if damage == "zeroed tensor":
        zero_one_tensor(ckpt)
    else:
        ckpt.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
    capsys.readouterr()
    assert pretrain(interrupted, mnist_root) == 2
    line = one_error_line(capsys, "pretrain")
    assert "cannot resume" in line and "--rerun" in line
    assert pretrain(interrupted, mnist_root, "--rerun") == 0
    metrics = verified_metrics(interrupted)
    assert metrics is not None and metrics["epochs"] == 2


def test_a_damaged_model_file_is_refused_wherever_it_is_used(tmp_path, teacher_file, mnist_root,
                                                             capsys):
    damaged = tmp_path / "model.safetensors"
    damaged.write_bytes(teacher_file.read_bytes())
    zero_one_tensor(damaged)
    for argv in (["evaluate", f"checkpoint={damaged}"],
                 ["finetune", f"teacher={damaged}", "init.strategy=copy_all"],
                 ["distill", f"teacher={damaged}"]):
        out = tmp_path / argv[0]
        assert cli.main([argv[0], "-o", str(out), *argv[1:], f"data.root={mnist_root}"]) == 2
        assert "do not match the checksum" in one_error_line(capsys, argv[0])
        assert not out.exists()


def test_complete_means_every_output_present_and_unchanged(tmp_path, mnist_root, capsys):
    out = tmp_path / "run"
    assert pretrain(out, mnist_root, "optim.epochs=1") == 0
    assert verified_metrics(out) is not None
    assert make_record("teacher", {}, out, 0)["status"] == "ok"
    model = out / "model.safetensors"
    saved = model.read_bytes()
    model.unlink()
    assert verified_metrics(out) is None
    assert "its output model.safetensors is missing" in make_record("teacher", {}, out, 0)["error"]
    capsys.readouterr()
    assert pretrain(out, mnist_root, "optim.epochs=1") == 2
    assert "fails verification (its output model.safetensors is missing)" in one_error_line(
        capsys, "pretrain")
    model.write_bytes(saved[:-1] + bytes([saved[-1] ^ 1]))           # one bit changed
    assert verified_metrics(out) is None
    assert check_run(out)[1] == "its output model.safetensors has changed since the run wrote it"
    (out / "metrics.json").write_text('{"top1": NaN, "outputs": {}}')  # not JSON
    assert verified_metrics(out) is None
    assert pretrain(out, mnist_root, "optim.epochs=1", "--rerun") == 0
    assert verified_metrics(out) is not None


def test_a_nan_model_is_refused_in_one_line_without_writing_a_result(tmp_path, mnist_root,
                                                                     capsys):
    model = create_vit(ModelSpec("cpu96", "softmax", 10, 28, 1))
    with torch.no_grad():
        model.head.weight.fill_(float("nan"))
    path = tmp_path / "nan.safetensors"
    save_model(model, path)
    out = tmp_path / "eval"
    assert evaluate(out, path, mnist_root) == 2              # bad input, before any compute
    assert "non-finite weights (NaN or inf) in 1 tensor(s): head.weight" in \
        capsys.readouterr().err
    assert not (out / "metrics.json").exists() and verified_metrics(out) is None


def test_a_second_writer_is_refused_while_the_first_holds_the_folder(tmp_path, teacher_file,
                                                                      mnist_root, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / MARKER).write_text('{"linvit": "run folder", "stage": "evaluate", "files": []}')
    fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)       # another process's run, in effect
    try:
        # flock locks belong to an open file, so this process's second open() conflicts too
        assert evaluate(out, teacher_file, mnist_root) == 2
        assert "another linvit process is writing" in one_error_line(capsys, "evaluate")
        assert not (out / "metrics.json").exists()
    finally:
        os.close(fd)
    assert evaluate(out, teacher_file, mnist_root) == 0


def test_leftover_temporaries_are_removed_and_permissions_are_consistent(tmp_path, teacher_file,
                                                                        mnist_root):
    out = tmp_path / "run"
    assert evaluate(out, teacher_file, mnist_root) == 0
    leftover = out / ".metrics.json.a1b2c3d4.tmp"            # an atomic write killed half-way
    leftover.write_text("{")
    users = out / ".notes.tmp"                               # not linvit's naming: kept
    users.write_text("the user's")
    assert evaluate(out, teacher_file, mnist_root, "--rerun") == 0
    assert not leftover.exists() and users.exists()
    users.unlink()
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir() if p.is_file()}
    assert modes == {name: file_mode() for name in modes}, modes


def test_a_resume_may_change_threads_and_progress_but_not_results(interrupted, mnist_root):
    """The workflow passes run.threads=<cores it was given>: an interrupted job resumed on
    fewer cores must continue from its checkpoint, with and without --rerun."""
    assert pretrain(interrupted, mnist_root, "run.threads=1", "--rerun") == 0
    assert "resuming" in (interrupted / "run.log").read_text()
    assert verified_metrics(interrupted)["epochs"] == 2


@pytest.mark.parametrize("config_yaml", ["stage: x\nconfig: [1, 2]\n", "- a list\n",
                                         "a: 1\na: 2\n", "{unclosed\n"])
def test_a_run_folder_with_malformed_files_gets_one_line(config_yaml, tmp_path, teacher_file,
                                                         mnist_root, capsys):
    out = tmp_path / "run"
    assert evaluate(out, teacher_file, mnist_root) == 0
    (out / "config.yaml").write_text(config_yaml)
    capsys.readouterr()
    before = snapshot(out)
    for rerun in ([], ["--rerun"]):
        assert evaluate(out, teacher_file, mnist_root, *rerun) == 2
        assert "unreadable" in one_error_line(capsys, "evaluate")
    assert snapshot(out) == before
    metrics = read_json(out / "metrics.json")
    (out / "metrics.json").write_text(json.dumps({**metrics, "outputs": []}))
    assert verified_metrics(out) is None


def test_foreign_safetensors_with_a_format_key_load_unchecked(tmp_path):
    """huggingface_hub writes {"format": "pt"} into every file: that is not a linvit file."""
    from linvit.models import read_state_dict

    save_file({"w": torch.ones(2)}, str(tmp_path / "hf.safetensors"), metadata={"format": "pt"})
    assert torch.equal(read_state_dict(tmp_path / "hf.safetensors")["w"], torch.ones(2))


def test_an_input_among_the_files_a_run_removes_or_writes_is_refused_untouched(
        tmp_path, mnist_root, capsys):
    """--rerun replaces a folder's previous run; it must never delete or overwrite what the new
    run reads (the run's own error message suggests --rerun)."""
    out = tmp_path / "t"
    assert pretrain(out, mnist_root) == 0
    capsys.readouterr()
    before = snapshot(out)
    model = out / "model.safetensors"
    assert cli.main(["robustness", "-o", str(out), f"checkpoint={model}",
                     f"data.root={mnist_root}", "--rerun"]) == 2     # would remove it
    line = one_error_line(capsys, "robustness")
    assert line.startswith(f"linvit robustness: error: checkpoint: {model}")
    assert "this run replaces (model.safetensors)" in line
    assert cli.main(["select", "-o", str(out), f"teacher={model}", "size=cpu96",
                     f"data.root={mnist_root}", "--rerun"]) == 2     # would overwrite it
    assert "teacher: " in one_error_line(capsys, "select")
    assert snapshot(out) == before


def test_a_run_whose_input_file_changed_is_no_longer_complete(tmp_path, mnist_root, capsys):
    """metrics.json lists the digests of the files the run read: a changed input makes the run
    stale (not reported, not reused); a gone one cannot be checked and does not count."""
    teacher = tmp_path / "teacher.safetensors"
    torch.manual_seed(0)
    save_model(create_vit(ModelSpec("cpu96", "softmax", 10, 28, 1)), teacher)
    out = tmp_path / "e"
    assert evaluate(out, teacher, mnist_root) == 0
    assert str(teacher.resolve()) in read_json(out / "metrics.json")["inputs"]
    assert verified_metrics(out) is not None
    original = teacher.read_bytes()
    torch.manual_seed(1)
    save_model(create_vit(ModelSpec("cpu96", "softmax", 10, 28, 1)), teacher)
    assert verified_metrics(out) is None
    capsys.readouterr()
    assert evaluate(out, teacher, mnist_root) == 2
    assert (f"fails verification (its input {teacher.resolve()} has changed since the run read "
            "it)") in one_error_line(capsys, "evaluate")
    teacher.write_bytes(original)
    assert verified_metrics(out) is not None
    teacher.unlink()
    assert verified_metrics(out) is not None
