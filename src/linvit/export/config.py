"""Config of `linvit export`."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from linvit.config import RunCfg
from linvit.errors import ConfigError

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


@dataclass
class ExportConfig:
    source: str | None = None          # a finished linvit run folder holding model.safetensors
    push_to_hub: str | None = None     # ORG/NAME: upload the folder to the Hugging Face Hub
    private: bool = False              # a new Hub repository is private
    # the Hub's address (a mirror, a self-hosted one); None: $HF_ENDPOINT or huggingface.co
    hub_endpoint: str | None = None
    license: str = "mit"               # the card's license (an SPDX id or the Hub's name for it)
    seed_runs: bool = True             # the card's top-1 over the source's sibling seed runs
    run: RunCfg = field(default_factory=RunCfg)

    def validate(self, p: str) -> None:
        if self.source is None:
            raise ConfigError("source: required (a finished linvit run folder: "
                              "`linvit export RUN_DIR -o DIR`)")
        if not Path(self.source).is_dir():
            raise ConfigError(f"source: not a folder: {self.source}")
        if self.push_to_hub is not None and not REPO_ID.match(self.push_to_hub):
            raise ConfigError(f"push_to_hub: {self.push_to_hub!r} is not a Hub repository id "
                              "(ORG/NAME)")
        if not re.match(r"^[\w.+-]+$", self.license):
            raise ConfigError(f"license: {self.license!r} is not a license identifier")
