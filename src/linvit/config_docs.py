"""A stage's whole config as commented YAML (`linvit <stage> --print-config`), every field with its
default and a one-line description read from the comments beside it in the config dataclass.

The comments are the descriptions: a field's trailing comment, or else the comment lines just above
it, so that what a reader of the source sees and what `--print-config` prints cannot drift apart.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import textwrap
import tokenize
import typing

import yaml


@functools.cache
def field_docs(cls) -> dict[str, str]:
    """Field name -> its one-line description, for a config dataclass and the ones it extends."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_class_docs(klass))
    return docs


def _class_docs(cls) -> dict[str, str]:
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    comments = {}                       # line number -> (column, text, is the whole line)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            whole = not lines[row - 1][:col].strip()
            comments[row] = (col, tok.string.lstrip("#").strip(), whole)
    body = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)).body
    docs = {}
    for node in body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            text = _trailing(comments, node) or _leading(comments, node)
            if text:
                docs[node.target.id] = text
    return docs


def _trailing(comments: dict, node) -> str:
    """The comment after the field's code, with the comment lines aligned under it."""
    parts, column = [], None
    for row in range(node.lineno, node.end_lineno + 1):
        if row in comments and not comments[row][2]:
            column = comments[row][0]
            parts.append(comments[row][1])
    row = node.end_lineno + 1
    while column is not None and row in comments and comments[row][2] \
            and comments[row][0] == column:
        parts.append(comments[row][1])
        row += 1
    return " ".join(parts)


def _leading(comments: dict, node) -> str:
    """The block of whole-line comments just above the field, at its indentation."""
    parts, row = [], node.lineno - 1
    while row in comments and comments[row][2] and comments[row][0] == node.col_offset:
        parts.insert(0, comments[row][1])
        row -= 1
    return " ".join(parts)


def description(cls, name: str) -> str:
    """`cls.name`'s one-line description: its comments, or for a section its class's docstring."""
    doc = field_docs(cls).get(name, "")
    section = _section_class(typing.get_type_hints(cls)[name])
    if doc or section is None:
        return doc
    text = (section.__doc__ or "").strip()
    # a dataclass without a docstring gets its signature as __doc__: not a description
    return "" if text.startswith(f"{section.__name__}(") else text.splitlines()[0]


def _section_class(tp):
    """The config dataclass a field holds (directly or as `X | None`), else None."""
    for candidate in (tp, *typing.get_args(tp)):
        if dataclasses.is_dataclass(candidate):
            return candidate
    return None


def default_of(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None                                   # required: printed as null, named as such


def _scalar(value) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10_000)
    return text.removesuffix("\n...\n").strip()


def config_lines(cls, instance=None, indent: str = "") -> list[str]:
    """The YAML lines of `cls` with its defaults (or `instance`'s values, for a section whose
    default the enclosing config sets): a comment line above each field."""
    hints, out = typing.get_type_hints(cls), []
    for f in dataclasses.fields(cls):
        required = instance is None and f.default is dataclasses.MISSING \
            and f.default_factory is dataclasses.MISSING
        doc = description(cls, f.name)
        if required:
            doc = f"(required) {doc}".strip()
        if doc:
            out.append(f"{indent}# {doc}")
        section = _section_class(hints[f.name])
        value = default_of(f) if instance is None else getattr(instance, f.name)
        if section is not None and value is not None:
            out.append(f"{indent}{f.name}:")
            out += config_lines(section, value, indent + "  ")
        else:
            out.append(f"{indent}{f.name}: {_scalar(value)}")
    return out


def print_config(stage: str, cls, instance=None) -> str:
    """The stage's config as YAML `-c` reads back: its defaults, or `instance`'s values."""
    what = "its default" if instance is None else "its value in this config"
    head = [f"# linvit {stage}: every field with {what}; edit and run it with",
            f"#   linvit {stage} -c THIS_FILE -o DIR  (field=value words override it)"]
    return "\n".join(head + config_lines(cls, instance)) + "\n"
