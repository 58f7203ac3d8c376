"""The workflow's config schema (the checkout's workflow/schemas/config.schema.yaml), read once:
the one source of the grid-name pattern and of the keys that make a config a grid, which the
config check applies where the schema is not read (a config given in Python) and names in its
messages."""
from __future__ import annotations

from pathlib import Path

import yaml

PATH = Path(__file__).resolve().parents[3] / "workflow" / "schemas" / "config.schema.yaml"
SCHEMA = yaml.safe_load(PATH.read_text())
# Grid names become folder names, wildcards and command-line words: a letter or digit first (no
# leading '-' or '.'), then no slash, space, quote or shell character; '+' for strategies such as
# copy_mlp+distill.
NAME_PATTERN = SCHEMA["$defs"]["name"]["pattern"]
# The keys that make a config a grid.
GRID_KEYS = tuple(SCHEMA["required"])
