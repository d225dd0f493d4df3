#!/usr/bin/env bash
# The test command from the README: set up, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The real Slurm test cluster (munge, MariaDB, slurmdbd, slurmctld, two slurmd); needs root, as in
# CI. Without root the cluster tests skip and say so.
if [[ $(id -u) -eq 0 ]]; then
    bash scripts/slurm-cluster.sh up
fi
PY=${PYTHON:-python3}
"$PY" -m pytest -q "$@"
