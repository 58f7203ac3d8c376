"""The operator registry: one name -> one AttentionOperator class.

Adding an operator: one file in this folder (its class declares `name`), one line in OPERATORS.
Tests, the CLI's allowed values and the workflow grid all read this dict.
"""
from __future__ import annotations

import math

from linvit.attention.base import AttentionOperator
from linvit.attention.deltanet import DeltaNetAttention
from linvit.attention.focused import FocusedLinearAttention
from linvit.attention.gla import GatedLinearAttention
from linvit.attention.hedgehog import HedgehogAttention
from linvit.attention.inline import InLineAttention
from linvit.attention.linear import LinearAttention
from linvit.attention.mamba2 import Mamba2Attention
from linvit.attention.softmax import SoftmaxAttention
from linvit.attention.ttt import TTTAttention
from linvit.registry import Registry

# keyed by each class's own `name`, so the name is written once
OPERATORS: Registry[type[AttentionOperator]] = Registry.by_name(
    "operator",
    SoftmaxAttention,
    LinearAttention,
    FocusedLinearAttention,
    InLineAttention,
    HedgehogAttention,
    GatedLinearAttention,
    Mamba2Attention,
    DeltaNetAttention,
    TTTAttention,
)


get_operator = OPERATORS.lookup


def check_options(name: str, options: dict) -> dict:
    """`options` typed like the operator's declared defaults and checked against its rules;
    raises ValueError naming the option. An int option takes ints only (3.0 is refused, as a
    kernel size of 3.5 would be); a float option takes ints too; numbers must be finite."""
    cls = get_operator(name)
    unknown = sorted(set(options) - set(cls.options))
    if unknown:
        allowed = ", ".join(cls.options) or "none"
        raise ValueError(f"operator {name!r} has no option(s) {unknown}; allowed: {allowed}")
    out = {}
    for key, value in options.items():
        kind = type(cls.options[key])
        ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise ValueError(f"option {key} of {name!r}: expected {kind.__name__}, got {value!r}")
        rule, wanted = cls.option_rules.get(key, (_positive_finite, "finite and > 0"))
        if not rule(value):
            raise ValueError(f"option {key} of {name!r}: must be {wanted}, got {value!r}")
        out[key] = value
    return out


def _positive_finite(value) -> bool:
    return isinstance(value, bool) or (math.isfinite(value) and value > 0)


def operator_class(name: str, **options) -> type[AttentionOperator]:
    """The operator's class, or a subclass with some of its `options` overridden.

    timm's Block needs a class (it calls issubclass on attn_layer), hence a subclass rather than
    functools.partial.
    """
    cls = get_operator(name)
    options = check_options(name, options)
    if not options:
        return cls
    return type(cls.__name__, (cls,), dict(options))


__all__ = ["AttentionOperator", "OPERATORS", "check_options", "get_operator", "operator_class"]
