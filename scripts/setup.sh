#!/usr/bin/env bash
# Set up linvit on a fresh machine; safe to rerun (a stamp skips pip when nothing changed).
#   - a virtual environment in .venv with torch, timm, linvit (editable), Snakemake and its SLURM
#     executor plugin, pandas, matplotlib and the test tools
#   - with --dense, the OpenMMLab stack for the dense tasks (scripts/setup_openmmlab.sh: mmcv is
#     compiled once, minutes on 2 cores, then reused from ~/.cache/linvit/wheels)
#   - linvit's C++ CPU kernels (linear attention, gated scan, delta rule), compiled once (~20 s)
#     into ~/.cache/linvit/cpp
#     (optional: without a compiler the PyTorch paths run; linvit.ops.cpp_kernels)
#   - Fashion-MNIST from Debian's dataset-fashion-mnist package, when missing and apt is usable
# TORCH_SPEC overrides the torch pin, e.g. TORCH_SPEC="torch torchvision" for the newest.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_SPEC=${TORCH_SPEC:-"torch==2.14.1 torchvision==0.29.1"}

if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
stamp=".venv/.linvit-setup-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "[setup] installing $TORCH_SPEC, timm and linvit into .venv (first time: a few minutes)"
  .venv/bin/python -m pip install -q --upgrade pip
  # shellcheck disable=SC2086
  .venv/bin/python -m pip install -q $TORCH_SPEC
  .venv/bin/python -m pip install -q -e ".[workflow,test,data,slurm]"
  touch "$stamp"
fi

# Quick when already built (same source, torch and CPU); never fatal, the reason is printed.
.venv/bin/python -c "
import logging, sys
logging.basicConfig(level=logging.INFO, format='[setup] %(message)s')
from linvit.ops import cpp_kernels
sys.exit(0 if cpp_kernels.load() else 1)" || echo "[setup] continuing without the C++ kernels"

if [ "${1:-}" = "--dense" ]; then
  ./scripts/setup_openmmlab.sh
fi

fmnist=/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
if [ ! -f "$fmnist" ]; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "[setup] installing Debian's dataset-fashion-mnist"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null
  else
    echo "[setup] Fashion-MNIST is not at $fmnist: run 'sudo apt-get install dataset-fashion-mnist'" \
         "or pass data.root=<folder with the IDX files> to linvit" >&2
  fi
fi
