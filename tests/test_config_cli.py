"""Bad input fails with one clear message naming the field, before any compute."""
from __future__ import annotations

import re

import pytest

from linvit import cli
from linvit.attention import OPERATORS
from linvit.config import load_config, parse_overrides
from linvit.errors import ConfigError
from linvit.train.config import PretrainConfig
from linvit.transfer.config import DistillConfig, FinetuneConfig
from linvit.transfer.losses import LOSSES


@pytest.mark.parametrize("overrides, message", [
    (["optim.lrr=1"], "optim.lrr: unknown field; allowed: opt, lr"),
    (["model.operator=lineer"], "model.operator: 'lineer' is not one of: softmax, linear"),
    (["model.size=huge"], "model.size: 'huge' is not one of: cpu96"),
    (["optim.epochs=true"], "optim.epochs: expected int, got True"),
    (["optim.epochs=0"], "optim.epochs: must be > 0"),
    (["optim.lr=fast"], "optim.lr: expected float"),
    (["optim.warmup_epochs=10"], "optim.warmup_epochs: 10 leaves no epoch"),
    (["optim.opt=sgdd"], "optim.opt: 'sgdd' is not one of"),
    (["data.dataset=imagenet"], "data.dataset: 'imagenet' is not one of: fashion_mnist"),
    (["model.operator=focused", "model.operator_options.p=2"],
     "operator 'focused' has no option(s) ['p']"),
    (["run.device=tpu"], "run.device: 'tpu' is not one of: auto, cpu, cuda"),
    (["data=3"], "data: expected a mapping"),
    (["epochs"], "expected key=value"),
])
def test_bad_pretrain_configs_name_the_field(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(PretrainConfig, None, overrides)


@pytest.mark.parametrize("text", ["data: [1, 2]\n", "data: 3\n", "optim: {warmup: [1]}\n"])
def test_a_malformed_section_in_a_file_is_refused_not_replaced_by_an_override(tmp_path, text):
    # the override's mapping used to replace the file's list or scalar without a word
    (tmp_path / "c.yaml").write_text(text)
    section = "optim.warmup" if "warmup" in text else "data"
    with pytest.raises(ConfigError, match=f"^{re.escape(section)}: expected a mapping, got"):
        load_config(PretrainConfig, tmp_path / "c.yaml", [f"{section}.root=x"])


def test_optimizers_checked_without_timm_are_timms():
    """The names config checks without importing timm.optim are optimizers timm creates."""
    from timm.optim import list_optimizers

    from linvit.config import COMMON_OPTIMIZERS

    assert set(COMMON_OPTIMIZERS) <= set(list_optimizers())
    for name in COMMON_OPTIMIZERS:
        load_config(PretrainConfig, None, [f"optim.opt={name}"])


def test_transfer_configs_check_files_and_registry_names(tmp_path):
    teacher = tmp_path / "t.safetensors"
    teacher.write_bytes(b"")
    with pytest.raises(ConfigError, match="teacher: required"):
        load_config(FinetuneConfig, None, [])
    with pytest.raises(ConfigError, match="teacher: file not found"):
        load_config(FinetuneConfig, None, ["teacher=/no/such/file"])
    with pytest.raises(ConfigError, match="distilled: strategy 'copy_mlp\\+distill' needs"):
        load_config(FinetuneConfig, None, [f"teacher={teacher}"])
    with pytest.raises(ConfigError, match="init.copy: 'mlps' is not one of: embed, attn"):
        load_config(FinetuneConfig, None, [f"teacher={teacher}", "init.strategy=random",
                                           "init.copy=[mlps]"])
    with pytest.raises(ConfigError, match="distill.losses: 'kl' is not one of: attn_map_ce"):
        load_config(DistillConfig, None, [f"teacher={teacher}", "distill.losses={kl: 1}"])
    with pytest.raises(ConfigError, match="distill.train: 'attention' is not one of"):
        load_config(DistillConfig, None, [f"teacher={teacher}", "distill.train=[attention]"])
    with pytest.raises(ConfigError, match="distill.e2e_losses: 'kl' is not one of"):
        load_config(DistillConfig, None, [f"teacher={teacher}", "distill.e2e_losses={kl: 1}"])
    with pytest.raises(ConfigError, match="distill.e2e_epochs: 3 is more than the schedule's "
                                          "optim.epochs \\(2\\)"):
        load_config(DistillConfig, None, [f"teacher={teacher}", "optim.epochs=2",
                                          "distill.e2e_epochs=3"])
    with pytest.raises(ConfigError, match="distill.e2e_epochs: must be >= 0"):
        load_config(DistillConfig, None, [f"teacher={teacher}", "distill.e2e_epochs=-1"])
    with pytest.raises(ConfigError, match="distill.e2e_losses: attn_map_ce compare"):
        load_config(DistillConfig, None, [f"teacher={teacher}", "model.operator=gla",
                                          "distill.e2e_epochs=1",
                                          "distill.e2e_losses={attn_map_ce: 1}"])
    cfg = load_config(FinetuneConfig, None, [f"teacher={teacher}", "init.strategy=copy_mlp",
                                             "optim.lr=3e-4"])
    assert cfg.optim.lr == 3e-4 and cfg.init.resolve().name == "copy_mlp"


def test_yaml_file_and_overrides_merge(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: 0.002\n  epochs: 4\nmodel:\n  operator: inline\n")
    cfg = load_config(PretrainConfig, path, ["optim.epochs=5"])
    assert (cfg.optim.lr, cfg.optim.epochs, cfg.model.operator) == (0.002, 5, "inline")
    path.write_text("- a list\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(PretrainConfig, path)
    assert parse_overrides(["a.b=1", "a.c=[1, 2]"]) == {"a": {"b": 1, "c": [1, 2]}}


def test_override_values_are_parsed_once_but_never_shared():
    """Values are parsed once per text (a workflow start parses ~50 000), yet each call gets its
    own objects: a caller that changes one leaves the next call's value alone."""
    first = parse_overrides(["distill.layers=[0, 1]"])
    first["distill"]["layers"].append(2)
    assert parse_overrides(["distill.layers=[0, 1]"]) == {"distill": {"layers": [0, 1]}}
    with pytest.raises(ConfigError, match="not valid YAML"):      # errors are not remembered away
        parse_overrides(["a=[1"])
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_overrides(["a=[1"])


def test_cli_fails_before_compute_with_exit_2(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["pretrain", "-o", str(out), "model.operator=lineer"]) == 2
    assert "model.operator: 'lineer' is not one of" in capsys.readouterr().err
    assert not out.exists()                      # nothing was started
    assert cli.main(["finetune", "-o", str(out), "teacher=/missing.safetensors"]) == 2
    assert "teacher: file not found" in capsys.readouterr().err
    assert not out.exists()


def test_a_job_refuses_code_that_changed_since_its_stamp(tmp_path, capsys):
    """The workflow passes each job its code stamp: a listed file edited (or gone) between
    planning and running fails the job, naming the file, before the command starts."""
    from linvit.workflow import deps

    stamp = deps.code_stamp(tmp_path / "code", "pretrain", ["softmax"], [], ["fashion_mnist"])
    assert cli.main(["--code-stamp", str(stamp), "list"]) == 0
    lines = stamp.read_text().splitlines()
    edited = next(i for i, line in enumerate(lines) if line.endswith("linvit/cli.py"))
    lines[edited] = "0" * 64 + "  linvit/cli.py"
    lines.append("1" * 64 + "  linvit/gone.py")
    bad = tmp_path / "bad.txt"
    bad.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert cli.main(["--code-stamp", str(bad), "list"]) == 2      # (not a slow command, if broken)
    out, err = capsys.readouterr()
    assert "linvit list: error: the code changed since the workflow planned" in err
    assert "linvit/cli.py, linvit/gone.py differ" in err and out == ""
    assert cli.main(["--code-stamp", str(tmp_path / "none.txt"), "list"]) == 2
    assert "cannot read the code stamp" in capsys.readouterr().err
    # a stamp that checks nothing does not pass: empty, comments only, or paths outside linvit
    for text, why in [("", "lists no source file"), ("# sources\n", "lists no source file"),
                      ("0" * 64 + "  ../../etc/passwd\n", "not a source file of the linvit"),
                      ("0" * 64 + "  /abs/linvit/x.py\n", "not a source file of the linvit"),
                      ("zz  linvit/cli.py\n", "not a sha256")]:
        bad.write_text(text)
        assert cli.main(["--code-stamp", str(bad), "list"]) == 2
        assert why in capsys.readouterr().err, text


def test_missing_dataset_names_the_paths_and_the_fix(tmp_path, capsys):
    code = cli.main(["pretrain", "-o", str(tmp_path / "r"), f"data.root={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2 and str(tmp_path) in err and "apt-get install dataset-fashion-mnist" in err


def test_list_prints_every_registry(capsys):
    from linvit.registries import registries

    assert cli.main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    every = registries()
    assert {"operators", "stages", "dense tasks", "shift sets", "checkpoint layouts",
            "corruptions"} <= set(every)
    for axis, entries in every.items():
        assert entries, axis
        for name in entries:     # on the axis's line, or (losses, strategies) on a line of its own
            assert any(line.startswith(f"{axis}:") and f" {name}" in line
                       or line.lstrip().startswith(name) for line in lines), (axis, name)


def test_bad_data_or_checkpoint_leaves_no_run_folder(tmp_path, mnist_root, capsys):
    assert cli.main(["pretrain", "-o", str(tmp_path / "a"), f"data.root={tmp_path}"]) == 2
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a checkpoint")
    assert cli.main(["distill", "-o", str(tmp_path / "b"), f"teacher={bad}",
                     f"data.root={mnist_root}"]) == 2
    assert "not a readable safetensors" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


MAP_LOSSES = [name for name, loss in LOSSES.items() if loss.target == "attn_map"]


@pytest.mark.parametrize("operator", [o for o in OPERATORS if o != "softmax"])
@pytest.mark.parametrize("loss", MAP_LOSSES)
def test_map_losses_are_refused_where_the_map_is_not_row_stochastic(tmp_path, operator, loss):
    teacher = tmp_path / "t.safetensors"
    teacher.write_bytes(b"")
    overrides = [f"teacher={teacher}", f"model.operator={operator}",
                 f"distill.losses={{{loss}: 1, attn_out_mse: 1}}"]
    kind = OPERATORS[operator].map_kind
    if kind == "stochastic":
        assert load_config(DistillConfig, None, overrides).distill.losses[loss] == 1
    else:
        with pytest.raises(ConfigError, match=f"{loss}.*'{operator}' has a {kind} map"):
            load_config(DistillConfig, None, overrides)
        # a zero weight switches the loss off: nothing to refuse
        load_config(DistillConfig, None, [*overrides[:2], f"distill.losses={{{loss}: 0, "
                                          "attn_out_mse: 1}"])


def test_a_run_folders_saved_config_is_a_config_of_its_own_stage(tmp_path):
    """config.yaml in a run folder wraps the resolved config with its stage (linvit.runs.rundir):
    passed back with -c it rebuilds the same config, for that stage only."""
    import dataclasses

    from linvit.io import write_yaml

    cfg = load_config(PretrainConfig, None, ["optim.epochs=3", "model.operator=gla"])
    saved = tmp_path / "config.yaml"
    write_yaml(saved, {"stage": "pretrain", "config": dataclasses.asdict(cfg)})
    assert load_config(PretrainConfig, saved, ["optim.lr=0.01"], "pretrain") == \
        dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, lr=0.01))
    with pytest.raises(ConfigError, match="the saved config of a pretrain run, not of probe"):
        load_config(PretrainConfig, saved, [], "probe")
