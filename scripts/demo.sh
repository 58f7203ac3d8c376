#!/usr/bin/env bash
# The main job on the embedded default: set up, then softmax teacher -> linear students
# (random and copy_mlp+distill) on Fashion-MNIST, ending with a comparison table.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/linvit demo --out "${1:-results/demo}"
