"""One registry type for every axis (linvit.registry): each registry `linvit list` shows is one,
looks names up with an error naming the allowed ones, and refuses a name twice."""
from __future__ import annotations

import pytest

from linvit.errors import UnknownName
from linvit.registries import registries
from linvit.registry import Registry

AXES = ["operators", "sizes", "datasets", "losses", "strategies", "dense tasks", "shift sets",
        "checkpoint layouts"]


@pytest.mark.parametrize("axis", AXES)
def test_every_axis_is_a_registry_whose_lookup_names_the_allowed_values(axis):
    registry = registries()[axis]
    assert isinstance(registry, Registry)
    names = list(registry)
    assert names and registry.names() == names
    assert all(registry.lookup(n) is registry[n] for n in names)
    with pytest.raises(UnknownName) as e:
        registry.lookup("no-such-entry")
    assert str(e.value) == (f"unknown {registry.kind} 'no-such-entry'; allowed: "
                            + ", ".join(names))
    assert isinstance(e.value, KeyError) and isinstance(e.value, ValueError)
    with pytest.raises(UnknownName):
        registry[["unhashable"]]


def test_a_name_is_registered_once_and_entries_keep_their_order():
    class Entry:
        def __init__(self, name):
            self.name = name

    registry = Registry.by_name("widget", Entry("b"), Entry("a"))
    assert list(registry) == ["b", "a"] and "a" in registry and len(registry) == 2
    with pytest.raises(ValueError, match="widget name 'a' is empty or taken"):
        registry.register("a", Entry("a"))
    with pytest.raises(ValueError, match="widget name '' is empty or taken"):
        Registry.by_name("widget", Entry(""))
