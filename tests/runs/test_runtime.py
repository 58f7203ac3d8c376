"""The run's precision (run.amp): bf16 autocast where it is faster (auto), on any device (bf16),
or none (float32); what a run records about it, and what its checkpoints hold it to."""
from __future__ import annotations

import platform

import pytest
import torch
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from torch import nn

from linvit.config import RunCfg, build, load_config
from linvit.errors import CheckpointError, ConfigError
from linvit.runs.environment import cpu_model, environment
from linvit.runs.runtime import CPU_CHECKS, bf16_pays, setup_runtime
from linvit.runs.stage import start_run
from linvit.runs.state import load_state, save_state
from linvit.train.config import PretrainConfig


def cpu_with(monkeypatch, *features):
    """torch.cpu's checks answering as a CPU with the named bf16 features."""
    for feature, check in CPU_CHECKS.items():
        monkeypatch.setattr(torch.cpu, check, lambda on=feature in features: on, raising=False)


def precision(amp="auto"):
    rt = setup_runtime(RunCfg(device="cpu", amp=amp))
    with rt.autocast():
        on = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu")
    assert (on or None) == rt.amp_dtype
    return rt.amp_dtype


@pytest.mark.parametrize("features, auto", [(("avx512_bf16",), torch.bfloat16),
                                            (("avx512_bf16", "amx"), None), ((), None)],
                         ids=["avx512-bf16", "amx", "no-bf16"])
def test_auto_is_bf16_only_where_it_was_measured_faster(monkeypatch, features, auto):
    cpu_with(monkeypatch, *features)
    assert precision("auto") == auto
    assert precision("bf16") == torch.bfloat16      # asked for: on any CPU
    assert precision("float32") is None


def test_auto_is_the_default():
    assert RunCfg().amp == "auto"


def test_a_torch_without_the_cpu_checks_means_float32(monkeypatch):
    for check in CPU_CHECKS.values():
        monkeypatch.delattr(torch.cpu, check, raising=False)
    assert bf16_pays(torch.device("cpu")) is False


@pytest.mark.parametrize("value", [True, False, 1, "fp16", None])
def test_amp_takes_auto_bf16_or_float32_only(value):
    with pytest.raises(ConfigError, match=r"run\.amp"):
        build(RunCfg, {"amp": value}, "run.").validate("run")


def test_the_run_records_what_decided_its_precision(monkeypatch):
    cpu_with(monkeypatch, "avx512_bf16")
    env = environment()
    assert (env["cpu_avx512_bf16"], env["cpu_amx"]) == (True, False)
    cpu_with(monkeypatch, "amx")
    assert (environment()["cpu_avx512_bf16"], environment()["cpu_amx"]) == (False, True)
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()


def test_a_stage_logs_and_records_its_precision(monkeypatch, caplog, tmp_path):
    cpu_with(monkeypatch, "avx512_bf16")
    cfg = load_config(PretrainConfig, None, ["run.device=cpu", "run.progress=false"])
    with caplog.at_level("INFO", logger="linvit"):
        rt, run = start_run(cfg, tmp_path / "run", "pretrain")
    assert "bfloat16 autocast on cpu (run.amp=auto)" in caplog.text
    assert run.precision() == rt.precision == "bfloat16 autocast"       # metrics.json's


def state_round_trip(tmp_path, saved: dict, resumed: dict):
    model = nn.Linear(3, 2)
    optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-3)
    scheduler, _ = create_scheduler_v2(optimizer, sched="cosine", num_epochs=2)
    save_state(tmp_path / "state.safetensors", model, optimizer, scheduler, 1, [], saved)
    return load_state(tmp_path / "state.safetensors", model, optimizer, scheduler, resumed)


def test_a_checkpoint_continues_only_in_the_precision_it_started_in(tmp_path):
    """run.amp=auto decides by machine: a run moved to a machine that decides otherwise is refused
    by name, not continued in another precision; another config stays 'another run'."""
    run = {"model": {"size": "cpu64"}}
    bf16, f32 = {**run, "precision": "bfloat16 autocast"}, {**run, "precision": "float32"}
    assert state_round_trip(tmp_path, bf16, bf16) == (1, [])
    assert state_round_trip(tmp_path, bf16, run) == (1, [])   # the run folder's check: config only
    with pytest.raises(CheckpointError, match=r"trained in bfloat16 autocast.*continue in "
                                              r"float32.*--rerun"):
        state_round_trip(tmp_path, bf16, f32)
    for resumed in (f32, run):             # older checkpoints: the trainer's and the folder's check
        with pytest.raises(CheckpointError, match="before linvit recorded the training precision"):
            state_round_trip(tmp_path, run, resumed)
    with pytest.raises(CheckpointError, match="another run"):
        state_round_trip(tmp_path, bf16, {**bf16, "model": {"size": "cpu96"}})


def test_the_run_records_its_cpu_model(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: X\nmodel name\t: Some CPU @ 2.0GHz\n\n"
                    "processor\t: 1\nmodel name\t: Some CPU @ 2.0GHz\n")
    assert cpu_model(info) == "Some CPU @ 2.0GHz"
    assert cpu_model(tmp_path / "absent") == platform.processor()
    assert environment()["cpu"] == cpu_model()
