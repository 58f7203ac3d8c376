"""The operator registry: one name -> one AttentionOperator class.

Adding an operator: one file in this folder, one line in OPERATORS. Tests, the CLI's allowed
values and the workflow grid all read this dict.
"""
from __future__ import annotations

from linvit.attention.base import AttentionOperator
from linvit.attention.focused import FocusedLinearAttention
from linvit.attention.hedgehog import HedgehogAttention
from linvit.attention.inline import InLineAttention
from linvit.attention.linear import LinearAttention
from linvit.attention.softmax import SoftmaxAttention

OPERATORS: dict[str, type[AttentionOperator]] = {
    "softmax": SoftmaxAttention,
    "linear": LinearAttention,
    "focused": FocusedLinearAttention,
    "inline": InLineAttention,
    "hedgehog": HedgehogAttention,
}


def get_operator(name: str) -> type[AttentionOperator]:
    try:
        return OPERATORS[name]
    except KeyError:
        raise ValueError(f"unknown operator {name!r}; allowed: {', '.join(OPERATORS)}") from None


def operator_class(name: str, **options) -> type[AttentionOperator]:
    """The operator's class, or a subclass with some of its `options` overridden.

    timm's Block needs a class (it calls issubclass on attn_layer), hence a subclass rather than
    functools.partial.
    """
    cls = get_operator(name)
    unknown = sorted(set(options) - set(cls.options))
    if unknown:
        allowed = ", ".join(cls.options) or "none"
        raise ValueError(f"operator {name!r} has no option(s) {unknown}; allowed: {allowed}")
    if not options:
        return cls
    return type(cls.__name__, (cls,), dict(options))


__all__ = ["AttentionOperator", "OPERATORS", "get_operator", "operator_class"]
