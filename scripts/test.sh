#!/usr/bin/env bash
# Set up, then run the test suite (CI runs exactly this through .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --dense
exec .venv/bin/python -m pytest -q "$@"
