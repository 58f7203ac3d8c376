"""linvit.workflow.cluster: the SLURM profile's site settings and job-status command, checked
before any submission; and how a job's processes share its allocation (linvit.runs.runtime). The
cluster itself: tests/workflow/test_slurm.py."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from linvit.errors import ConfigError
from linvit.runs.runtime import check_gpu_share, process_threads
from linvit.workflow.cluster import (
    SITE_SETTINGS,
    check_site_settings,
    check_status_command,
    scontrol_setting,
    unset_variables,
)

PROFILE = Path(__file__).resolve().parents[2] / "workflow" / "profiles" / "slurm" / "config.yaml"

SHOW_CONFIG = """Configuration data as of 2026-01-01T00:00:00
AccountingStorageHost   = (null)
AccountingStorageType   = {storage}
MinJobAge               = 600 sec
"""


def test_unset_placeholders_are_found_in_either_spelling_once():
    expressions = ["slurm_partition=$LINVIT_SLURM_PARTITION", "runtime=60",
                   "slurm_account=${LINVIT_SLURM_ACCOUNT}", "x=$LINVIT_SLURM_PARTITION"]
    assert unset_variables(expressions, {}) == ["LINVIT_SLURM_PARTITION", "LINVIT_SLURM_ACCOUNT"]
    assert unset_variables(expressions, {"LINVIT_SLURM_ACCOUNT": ""}) == [
        "LINVIT_SLURM_PARTITION"]


def test_an_unset_site_setting_is_refused_naming_it_and_what_to_set():
    with pytest.raises(ConfigError) as error:
        check_site_settings(["slurm_partition=$LINVIT_SLURM_PARTITION",
                             "slurm_account=$LINVIT_SLURM_ACCOUNT"],
                            {"LINVIT_SLURM_ACCOUNT": "proj1"})
    message = str(error.value)
    assert "LINVIT_SLURM_PARTITION is not set" in message
    assert "sinfo -s" in message and "export LINVIT_SLURM_PARTITION=..." in message
    assert "LINVIT_SLURM_ACCOUNT" not in message


def test_set_site_settings_pass_and_empty_means_the_clusters_default():
    check_site_settings(["slurm_partition=$LINVIT_SLURM_PARTITION", "runtime=60"],
                        {"LINVIT_SLURM_PARTITION": "gpu"})
    check_site_settings(["slurm_account=$LINVIT_SLURM_ACCOUNT"], {"LINVIT_SLURM_ACCOUNT": ""})
    check_site_settings(["mem_mb=16000", "tmpdir=system_tmpdir"], {})


def test_the_shipped_profile_takes_exactly_the_documented_site_settings():
    """Every placeholder of the shipped profile has its explanation (and no stale one stays)."""
    profile = yaml.safe_load(PROFILE.read_text())
    expressions = [f"{k}={v}" for k, v in profile["default-resources"].items()]
    expressions += [f"{k}={v}" for rule in profile["set-resources"].values()
                    for k, v in rule.items()]
    assert unset_variables(expressions, {}) == list(SITE_SETTINGS)


def test_sacct_is_refused_without_an_accounting_database():
    with pytest.raises(ConfigError, match="use squeue instead") as error:
        check_status_command("sacct", SHOW_CONFIG.format(storage="accounting_storage/none"))
    assert "MinJobAge after its end (here 600 sec)" in str(error.value)


@pytest.mark.parametrize("command, storage", [
    ("sacct", "accounting_storage/slurmdbd"),
    ("squeue", "accounting_storage/none"),
    ("squeue", "accounting_storage/slurmdbd"),
    (None, "accounting_storage/none"),          # the plugin's own default, decided elsewhere
])
def test_status_commands_the_cluster_can_answer_pass(command, storage):
    check_status_command(command, SHOW_CONFIG.format(storage=storage))


def test_an_unreadable_configuration_refuses_nothing():
    """No `scontrol` answer: the plugin reports the unreachable cluster itself."""
    check_status_command("sacct", "")


def test_scontrol_settings_are_read_by_exact_key():
    text = SHOW_CONFIG.format(storage="accounting_storage/none")
    assert scontrol_setting(text, "AccountingStorageType") == "accounting_storage/none"
    assert scontrol_setting(text, "AccountingStorage") is None
    assert scontrol_setting(text, "MinJobAge") == "600 sec"


@pytest.mark.parametrize("threads, processes, share", [
    (32, 8, 4), (2, 2, 1), (1, 2, 1), (3, 2, 1), (2, 1, 2), (None, 4, None), (4, 0, 4)])
def test_the_processes_of_a_job_share_its_threads(threads, processes, share):
    """`linvit --nproc N` on a job of T cores: each process takes T // N threads (at least one),
    not T each."""
    assert process_threads(threads, processes) == share


def test_a_process_without_a_gpu_of_its_own_is_refused(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    check_gpu_share(1, 2)
    with pytest.raises(ConfigError, match=r"process 2 of this node has no GPU of its own: torch "
                                          r"sees 2 \(CUDA_VISIBLE_DEVICES=0,1\)"):
        check_gpu_share(2, 2)


def test_training_jobs_are_signalled_before_their_limit_and_may_be_requeued():
    """What linvit.runs.preempt needs of SLURM: a signal it handles ahead of the time limit, and
    a job that `scontrol requeue` may put back (sbatch --requeue), on every training rule."""
    from linvit.runs.preempt import SIGNALS

    resources = yaml.safe_load(PROFILE.read_text())["set-resources"]
    for rule in ("teacher", "distill", "finetune"):
        extra = resources[rule]["slurm_extra"].strip("'").split()
        signal_arg = next(a for a in extra if a.startswith("--signal="))
        name = signal_arg.split("=", 1)[1].split("@")[0].removeprefix("B:")
        assert f"SIG{name}" in {s.name for s in SIGNALS} and "--requeue" in extra, rule
