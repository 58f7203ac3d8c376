"""One registry type for every axis one can add an entry to (operators, init strategies, losses,
datasets, sizes, dense tasks, shift sets, checkpoint layouts), after timm's `_registry.py`: the
entries by name in the order they were registered, lookup that names the allowed values, and
listing, in one place. A registry is a read-only mapping (`name in REG`, `REG.items()`); adding
an entry is one line where the registry is made. No import beyond the standard library: the
workflow's planning reads sizes and names without torch."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Generic, TypeVar

from linvit.errors import UnknownName

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """`kind` names one entry in messages ("operator", "init strategy")."""

    def __init__(self, kind: str, entries: Mapping[str, T] | Iterable[tuple[str, T]] = ()):
        self.kind = kind
        self._entries: dict[str, T] = {}
        for name, entry in (entries.items() if isinstance(entries, Mapping) else entries):
            self.register(name, entry)

    @classmethod
    def by_name(cls, kind: str, *entries: T, name: Callable[[T], str] = lambda e: e.name):
        """A registry keyed by each entry's own name (written once, on the entry)."""
        return cls(kind, [(name(e), e) for e in entries])

    def register(self, name: str, entry: T) -> T:
        if not name or name in self._entries:
            raise ValueError(f"{self.kind} name {name!r} is empty or taken")
        self._entries[name] = entry
        return entry

    def __getitem__(self, name: str) -> T:
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise UnknownName(f"unknown {self.kind} {name!r}; allowed: "
                              f"{', '.join(self._entries)}") from None

    lookup = __getitem__          # `get_operator = OPERATORS.lookup`: one lookup for every axis

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        return list(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"
