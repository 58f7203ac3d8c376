"""The package structure: an import graph without cycles, stages that do not reach into each other.

Built from linvit.workflow.deps' static import graph (every import in a file, lazy ones included),
so what the workflow's code-dependency map sees is what these tests check.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from linvit.workflow import deps

# Packages that are stages of the pipeline; shared code lives outside them (runs/, render/,
# config.py, models/, data/, attention/, ops/, io.py, errors.py, trees.py).
STAGE_PACKAGES = ("train", "transfer", "dense", "bench", "robustness", "report", "export")
# Stages that share no code with another stage (transfer builds on train's training loop).
SELF_CONTAINED = ("dense", "bench", "robustness", "report")


def unit(path: Path) -> str | None:
    """`path`'s top-level unit under linvit: a subpackage or a top-level module (None: the
    package's own __init__)."""
    parts = path.relative_to(deps.PACKAGE_ROOT).with_suffix("").parts
    return None if parts == ("__init__",) else parts[0]


def unit_graph(graph: dict[Path, frozenset[Path]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for src, targets in graph.items():
        a = unit(src)
        if a is None:
            continue
        out.setdefault(a, set()).update(b for b in map(unit, targets) if b not in (None, a))
    return out


def find_cycle(graph: dict) -> list | None:
    """One cycle of `graph` (node -> successors) as a list of nodes, or None."""
    state: dict = {}
    stack: list = []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ()), key=str):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph, key=str):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_package_graph_has_no_cycle():
    cycle = find_cycle(unit_graph(deps.import_graph()))
    assert cycle is None, "package import cycle: " + " -> ".join(cycle)


def test_the_module_graph_has_no_cycle():
    graph = {src: {t for t in targets if t.name != "__init__.py"}
             for src, targets in deps.import_graph().items()}
    cycle = find_cycle(graph)
    rel = [str(p.relative_to(deps.SRC_ROOT)) for p in cycle or []]
    assert cycle is None, "module import cycle: " + " -> ".join(rel)


@pytest.mark.parametrize("stage", SELF_CONTAINED)
def test_a_self_contained_stage_imports_no_other_stage(stage):
    reached = unit_graph(deps.import_graph()).get(stage, set())
    assert not reached & (set(STAGE_PACKAGES) - {stage}), \
        f"{stage}/ imports {sorted(reached & set(STAGE_PACKAGES))}"


def test_reporting_reads_results_files_only():
    """report/ draws from files a stage wrote: it builds no model and reads no dataset."""
    reached = unit_graph(deps.import_graph())["report"]
    assert not reached & {"models", "data", "attention", "ops"}, sorted(reached)


def test_every_stage_package_exists():
    """The lists above name real packages (a renamed package would make the checks vacuous)."""
    units = set(unit_graph(deps.import_graph()))
    assert set(STAGE_PACKAGES) <= units, sorted(set(STAGE_PACKAGES) - units)
    # and every package a stage runs from is among them (a stage in a new package is checked)
    from linvit.stages import STAGES
    run_from = {stage.entry.split(".")[1] for stage in STAGES.values()}
    assert run_from <= set(STAGE_PACKAGES), sorted(run_from - set(STAGE_PACKAGES))


def test_every_stage_has_a_code_map():
    """linvit.stages is the one list of stages: each has entry modules for the workflow's code
    map (deps) that hold its entry and its config."""
    from linvit.stages import STAGES

    entries = deps.stage_entries()
    for name, stage in STAGES.items():
        files = deps.closure(entries[name])
        for target in (stage.entry, stage.config):
            assert deps.module_file(target.split(":")[0]) in files, (name, target)


def test_error_classes_are_imported_from_errors_only():
    """One home per error class (linvit.errors): a re-export elsewhere would let two modules
    disagree on what a name means once one of them is edited."""
    import ast
    import inspect

    from linvit import errors

    names = {n for n, v in vars(errors).items() if inspect.isclass(v)
             and issubclass(v, BaseException) and v.__module__ == errors.__name__}
    assert "ConfigError" in names
    wrong = []
    for path in sorted(deps.PACKAGE_ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.ImportFrom) and node.module != "linvit.errors"
                    and any(a.name in names for a in node.names)):
                wrong.append(f"{path.relative_to(deps.SRC_ROOT)}:{node.lineno} ({node.module})")
    assert not wrong, "error classes not imported from linvit.errors: " + ", ".join(wrong)


def test_nothing_but_the_workflow_reaches_into_the_workflow_package():
    """linvit/workflow/ serves Snakemake alone: no stage, no core module and not the CLI imports
    it (a job checks its code stamp with linvit.code_digests)."""
    reached = {unit(src) for src, targets in deps.import_graph().items()
               if any(unit(t) == "workflow" for t in targets)}
    assert not reached - {"workflow"}, sorted(reached - {"workflow"})


def test_the_tests_mirror_the_packages():
    """tests/<package>/ tests src/linvit/<package>/ (whole-project checks stay at the top)."""
    tests = Path(__file__).resolve().parent
    folders = {p.parent.relative_to(tests).parts[0] for p in tests.rglob("test_*.py")
               if p.parent != tests}
    assert folders and not folders - {p.name for p in deps.PACKAGE_ROOT.iterdir() if p.is_dir()}, \
        sorted(folders)
