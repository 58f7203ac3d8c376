"""Checks of the cluster settings a workflow run uses, made before any job is submitted.

The SLURM profile (workflow/profiles/slurm) leaves site-specific values to environment variables
(`$LINVIT_SLURM_PARTITION`, `$LINVIT_SLURM_ACCOUNT`). Snakemake expands them only when it
evaluates a job's resources, and leaves an unset one as the literal text `$NAME`, which would
reach `sbatch` as a partition or account name and fail there, job by job.
`check_site_settings` refuses that at parse time, naming the variable and what to set.

`check_status_command` refuses `sacct` as the plugin's job-status command on a cluster without
an accounting database, where every status query would fail and the run would stall.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from linvit.errors import ConfigError

# What each of the profile's placeholders means, for the message when one is unset.
SITE_SETTINGS = {
    "LINVIT_SLURM_PARTITION": "the partition jobs run in (`sinfo -s` lists them; an empty value "
                              "uses the cluster's default partition)",
    "LINVIT_SLURM_ACCOUNT": "the account jobs are charged to (`sacctmgr show assoc "
                            "user=$USER format=account` lists yours; an empty value submits "
                            "without one)",
}
_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def unset_variables(expressions: Iterable[str], environ: Mapping[str, str]) -> list[str]:
    """Environment variables named (`$NAME` or `${NAME}`) in resource expressions such as
    `slurm_partition=$LINVIT_SLURM_PARTITION` that are not defined, in order of appearance."""
    missing: list[str] = []
    for expression in expressions:
        for braced, plain in _VARIABLE.findall(str(expression)):
            name = braced or plain
            if name not in environ and name not in missing:
                missing.append(name)
    return missing


def resource_expressions(settings) -> list[str]:
    """The `name=value` texts of a run's default-resources and set-resources (a profile's
    included), before Snakemake expands environment variables in them. `settings`: Snakemake's
    ResourceSettings (`workflow.resource_settings`)."""
    resources = [settings.default_resources, *settings.overwrite_resources.values()]
    return [arg for r in resources if r is not None for arg in getattr(r, "args", None) or []]


def check_site_settings(expressions: Iterable[str], environ: Mapping[str, str]) -> None:
    """Refuse a run whose profile's resources name environment variables that are not set.

    `expressions`: the `name=value` strings of the profile's default-resources and
    set-resources, as Snakemake parsed them (before expansion). Defined but empty is allowed:
    for the partition and account it means the cluster's default, as in `sbatch`."""
    missing = unset_variables(expressions, environ)
    if not missing:
        return
    lines = [f"  {name}: {SITE_SETTINGS.get(name, 'used by a resource of the profile')}"
             for name in missing]
    raise ConfigError(
        "the workflow profile takes site settings from the environment, and "
        f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set:\n"
        + "\n".join(lines)
        + f"\nset {'it' if len(missing) == 1 else 'them'} before running Snakemake, e.g. "
        + "export " + " ".join(f"{name}=..." for name in missing)
        + " (see docs/cluster.md)")


def scontrol_setting(show_config: str, key: str) -> str | None:
    """One value of `scontrol show config` output (lines `Key = value`), or None."""
    for line in show_config.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() == key:
            return value.strip()
    return None


def check_status_command(status_command: str | None, show_config: str) -> None:
    """Refuse `sacct` as the status command where SLURM keeps no accounting database
    (`AccountingStorageType = accounting_storage/none`): sacct then answers no query, and
    Snakemake would wait on jobs whose end it cannot see. `show_config`: the output of
    `scontrol show config`."""
    if status_command != "sacct":
        return
    storage = scontrol_setting(show_config, "AccountingStorageType")
    if storage == "accounting_storage/none":
        min_age = scontrol_setting(show_config, "MinJobAge") or "unknown"
        raise ConfigError(
            "slurm-status-command is sacct, but this cluster has no accounting database "
            "(scontrol show config: AccountingStorageType = accounting_storage/none), so sacct "
            "cannot report job states: use squeue instead (--slurm-status-command squeue, or "
            "slurm-status-command: squeue in the profile). squeue sees an ended job only for "
            f"MinJobAge after its end (here {min_age}), which must be longer than the plugin's "
            "status checks are apart (up to 180 s).")


def slurm_show_config() -> str:
    """`scontrol show config` of the cluster this machine submits to ('' where it cannot be
    read: the plugin reports an unreachable cluster itself, at its first submission)."""
    import subprocess

    try:
        run = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return run.stdout if run.returncode == 0 else ""


def check_executor(executor: str | None, executor_settings) -> None:
    """The checks of the executor a run starts with that need its settings (known only when the
    run starts): for SLURM, the job-status command against the cluster's accounting."""
    if executor == "slurm":
        check_status_command(getattr(executor_settings, "status_command", None),
                             slurm_show_config())
