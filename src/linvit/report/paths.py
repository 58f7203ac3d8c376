"""Where the report steps write in a results folder: one description for the steps that write
the files and the workflow rules that expect them (workflow/rules/*.smk hold no path of their
own). No heavy import: the Snakefile reads it at every start."""
from __future__ import annotations

from dataclasses import dataclass

COLLECTED = ("results", "curves", "distill_layers")     # collect's CSVs: <name>.csv
FIGURES = ("accuracy_by_init", "time_to_accuracy", "distill_layers", "claims")
TABLE_FORMATS = ("csv", "md", "tex")
FIGURE_FORMATS = ("png", "pdf")


@dataclass(frozen=True)
class ResultsFolder:
    """The aggregate files of the results folder `root` (each job's own files: workflow.jobs)."""
    root: str

    def at(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    @property
    def grid(self) -> str:
        return self.at("grid.json")

    @property
    def report(self) -> str:
        return self.at("report.md")

    @property
    def tables(self) -> str:
        return self.at("tables")

    @property
    def figures(self) -> str:
        return self.at("figures")

    def collected(self, name: str, sub: str = "") -> str:
        """One of collect's CSVs; `sub`: a sub-grid's own folder (dense)."""
        if name not in COLLECTED:
            raise ValueError(f"collect writes no {name!r}; it writes {', '.join(COLLECTED)}")
        return self.at(*([sub] if sub else []), f"{name}.csv")

    def section(self, name: str) -> str:
        """A section of report.md that a step of its own writes (robustness.md, dense.md)."""
        return self.at(f"{name}.md")

    def table(self, name: str, fmt: str) -> str:
        return self.at("tables", f"{name}.{fmt}")

    def figure(self, name: str, fmt: str = "") -> str:
        """A figure's file, or without `fmt` its stem (a step that writes every format)."""
        return self.at("figures", f"{name}.{fmt}" if fmt else name)

    def log(self, step: str) -> str:
        return self.at("logs", f"{step}.log")
