"""linvit's error classes, in a leaf module every package may import.

`LinvitError` is bad input (a config, a CLI argument, a checkpoint, data, an output folder): the CLI
prints its one-line message and exits with status 2, before any compute where it can. `RunFailed`
is a run that started and could not produce a trustworthy result (non-finite metrics): exit 1.
"""
from __future__ import annotations


class LinvitError(Exception):
    """Input linvit cannot use; the message names what is wrong and, where it can, the fix."""


class ConfigError(LinvitError, ValueError):
    """A config that cannot run; the message names the field."""


class CheckpointError(LinvitError, ValueError):
    """A checkpoint file that cannot be used as asked; the message names what is wrong."""


class DataError(LinvitError, ValueError):
    """A dataset on disk that cannot be read as it is (malformed files, refused pickles)."""


class DatasetNotFound(DataError, FileNotFoundError):
    """A dataset that is not on disk; the message names the paths looked at and how to install."""


class UnknownName(KeyError, ValueError):
    """A name no entry of a registry has (linvit.registry); the message names the allowed ones.
    A KeyError, as for any mapping, and a ValueError, as an unusable argument."""

    def __str__(self) -> str:             # KeyError would print the message quoted
        return str(self.args[0]) if self.args else ""


class ResultsError(LinvitError, ValueError):
    """Result files (records, grid.json, results.csv) that cannot be reported as they are, e.g.
    two records with one key; the message names the files."""


class RunDirError(LinvitError):
    """An output folder linvit must not or cannot write: foreign, locked, another run's."""


class RunFailed(RuntimeError):
    """A run that started but whose result cannot be trusted (e.g. non-finite metrics)."""


class RunPreempted(Exception):
    """A run stopped by a preemption signal after saving a checkpoint to resume from
    (linvit.runs.preempt): neither finished nor failed."""
