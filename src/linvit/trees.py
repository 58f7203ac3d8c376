"""Nested mappings (configs, records, workflow settings): one merge and one flatten for all."""
from __future__ import annotations

from typing import Any

from linvit.errors import ConfigError

# Mappings that are one value, not a section of fields: a loss-weight table or an operator's
# options is replaced whole by an override and stays one column of a results table.
WHOLE_MAPPINGS = ("losses", "operator_options")


def deep_merge(*trees: dict, prefix: str = "") -> dict:
    """Later trees over earlier ones: mappings merge key by key, anything else replaces. A mapping
    laid over a list or scalar (not null) is a ConfigError: the earlier value is malformed, and
    replacing it would drop it without a word (`data: [1, 2]` in a file, then `data.root=...`)."""
    out: dict = {}
    for tree in trees:
        for key, value in tree.items():
            old = out.get(key)
            if isinstance(value, dict) and isinstance(old, dict):
                out[key] = deep_merge(old, value, prefix=f"{prefix}{key}.")
            elif isinstance(value, dict) and old is not None:
                raise ConfigError(f"{prefix}{key}: expected a mapping, got {old!r}")
            else:
                out[key] = value
    return out


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """{'optim': {'lr': 0.001}} -> {'optim.lr': 0.001}. Empty mappings and WHOLE_MAPPINGS are
    values of their own."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value and key not in WHOLE_MAPPINGS:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def unflatten(flat: dict) -> dict:
    """{'optim.lr': 0.001} -> {'optim': {'lr': 0.001}} (flatten's inverse for dotted fields)."""
    out: dict = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def without(tree: dict, fields) -> dict:
    """`tree` with the dotted `fields` taken out."""
    out = {}
    for key, value in tree.items():
        inner = [f.split(".", 1)[1] for f in fields if f.startswith(f"{key}.")]
        if key in fields:
            continue
        out[key] = without(value, inner) if isinstance(value, dict) and inner else value
    return out


def non_finite(tree, prefix: str = "") -> list[str]:
    """'path=value' of every float in `tree` (nested dicts, lists) that is NaN or infinite: the
    one finiteness check of metrics, evaluations and records."""
    if isinstance(tree, dict):
        return [p for k, v in tree.items() for p in non_finite(v, f"{prefix}{k}.")]
    if isinstance(tree, (list, tuple)):
        return [p for i, v in enumerate(tree) for p in non_finite(v, f"{prefix}{i}.")]
    if isinstance(tree, float) and not (tree == tree and abs(tree) != float("inf")):
        return [f"{prefix.rstrip('.')}={tree}"]
    return []
