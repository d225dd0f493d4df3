#!/usr/bin/env bash
# The test command from the README: set up, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${PYTHON:-python3}
"$PY" -m pytest -q "$@"
