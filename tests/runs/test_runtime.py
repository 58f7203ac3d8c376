"""The run's precision: bf16 autocast of the training step where the device computes bf16 natively
(run.amp), float32 elsewhere, and what a run records about it."""
from __future__ import annotations

import pytest
import torch

from linvit.config import RunCfg
from linvit.runs.environment import environment
from linvit.runs.runtime import native_bf16, setup_runtime

CPU_CHECKS = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")


def cpu_features(monkeypatch, **supported):
    """torch.cpu's checks answering as a CPU with the named features (the others: absent)."""
    for name in CPU_CHECKS:
        answer = supported.get(name, False)
        monkeypatch.setattr(torch.cpu, name, lambda on=answer: on, raising=False)


@pytest.mark.parametrize("feature", CPU_CHECKS)
def test_either_native_bf16_feature_makes_the_cpu_step_bf16(monkeypatch, feature):
    cpu_features(monkeypatch, **{feature: True})
    rt = setup_runtime(RunCfg(device="cpu"))
    assert rt.amp_dtype == torch.bfloat16
    with rt.autocast():
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16


def test_a_cpu_that_would_emulate_bf16_trains_in_float32(monkeypatch):
    cpu_features(monkeypatch)
    rt = setup_runtime(RunCfg(device="cpu"))
    assert rt.amp_dtype is None
    with rt.autocast():
        assert not torch.is_autocast_enabled("cpu")


def test_amp_false_is_float32_on_any_cpu(monkeypatch):
    cpu_features(monkeypatch, _is_avx512_bf16_supported=True, _is_amx_tile_supported=True)
    assert setup_runtime(RunCfg(device="cpu", amp=False)).amp_dtype is None


def test_a_torch_without_the_cpu_checks_means_no_native_bf16(monkeypatch):
    for name in CPU_CHECKS:
        monkeypatch.delattr(torch.cpu, name, raising=False)
    assert native_bf16(torch.device("cpu")) is False


def test_the_run_records_what_decided_its_precision(monkeypatch):
    cpu_features(monkeypatch, _is_amx_tile_supported=True)
    assert environment()["cpu_bf16"] is True
    cpu_features(monkeypatch)
    env = environment()
    assert env["cpu_bf16"] is False
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()


def test_setup_logs_the_precision(monkeypatch, caplog):
    cpu_features(monkeypatch, _is_avx512_bf16_supported=True)
    with caplog.at_level("INFO", logger="linvit"):
        setup_runtime(RunCfg(device="cpu"))
    assert "bf16 autocast on cpu" in caplog.text
