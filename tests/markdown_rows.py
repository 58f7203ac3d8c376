"""Reading the Markdown tables linvit writes (pandas' to_markdown pads its cells): rows as lists of
stripped cells, so tests name cells, not the padding."""
from __future__ import annotations


def rows(text: str) -> list[list[str]]:
    """Every table row in `text` (header rows included, rule rows left out)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("|") or set(line) <= set("|:- "):
            continue
        out.append([cell.strip() for cell in line.strip("|").split("|")])
    return out


def has_row(text: str, *cells: str) -> bool:
    """Whether some row holds `cells` side by side."""
    want = list(cells)
    return any(row[i:i + len(want)] == want for row in rows(text) for i in range(len(row)))


def rows_with(text: str, *cells: str) -> list[list[str]]:
    want = list(cells)
    return [row for row in rows(text)
            if any(row[i:i + len(want)] == want for i in range(len(row)))]
