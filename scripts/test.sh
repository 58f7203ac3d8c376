#!/usr/bin/env bash
# Set up, then run the test suite (CI runs exactly this through .ci/run).
#   ./scripts/test.sh          the whole suite
#   ./scripts/test.sh --fast   the unit tests alone: everything not marked slow (no workflow runs,
#                              no end-to-end training); extra arguments go to pytest either way
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --dense
if [ "${1:-}" = "--fast" ]; then
  shift
  exec .venv/bin/python -m pytest -q -m "not slow" "$@"
fi
exec .venv/bin/python -m pytest -q "$@"
