"""What the machine is, for records and build keys: shared by runs/ (metrics.json's env) and
ops/ (the C++ kernel's build key), which must not import each other's side."""
from __future__ import annotations

import platform
from pathlib import Path


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (Linux's /proc/cpuinfo; elsewhere what `platform` says, maybe '')."""
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    return platform.processor()
