#!/usr/bin/env bash
# Install mmm-orch with its test and training extras on a fresh machine (Python >= 3.10).
# torch is pinned: `pip install torch==2.13.0` (a CPU wheel here); never an unpinned torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -m pip install --quiet --disable-pip-version-check torch==2.13.0
"$PY" -m pip install --quiet --disable-pip-version-check -e ".[train,test]"
