#!/usr/bin/env bash
# The test command from the README: set up (.venv), start the test schedulers, run the suite from
# the virtual environment. Tests that wait on a scheduler mostly sleep, so pytest-xdist runs them
# side by side (MMM_ORCH_TEST_WORKERS, default 6 on CI's 2 cores; tests sharing a module fixture
# are kept on one worker by an xdist_group); the few that stop a shared scheduler (marked
# `serial`) run first, alone.
# Before the tests: ruff (lint and format) and mypy on mmm_orch, and the documentation site built.
# `--fast`: only the tests that need no server, no root and no waiting (tests/conftest.py), for
# a developer's loop; the servers are not started. Its tests keep the CPUs busy rather than
# sleep, so it runs one worker a core (MMM_ORCH_TEST_WORKERS still wins) and no serial phase
# (the serial tests are not in it). CI runs everything.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
fast=0
[[ " $* " == *" --fast "* ]] && fast=1
# The real test schedulers (Slurm: munge, MariaDB, slurmdbd, slurmctld, three slurmd; OpenPBS:
# server, scheduler, comm and a MoM with three vnodes) need root, as in CI. Without root their
# tests skip and say so.
if [[ $(id -u) -eq 0 && $fast -eq 0 ]]; then
    bash scripts/slurm-cluster.sh up
    bash scripts/pbs-server.sh up
fi
PY=${MMM_ORCH_VENV:-.venv}/bin/python
BIN=$(dirname "$PY")
failed=0
# Lint, format and types first (seconds): ruff and mypy as pyproject.toml configures them, on
# mmm_orch. A finding fails the run at the end, as a failing test does, and the tests still run.
"$BIN/ruff" check --quiet || failed=1
"$BIN/ruff" format --check --quiet || { echo "ruff format: run .venv/bin/ruff format" >&2; failed=1; }
"$BIN/mypy" || failed=1
# The documentation site: the pages made from the code up to date with it, and built with
# warnings (a broken link, a page missing from the navigation) as errors.
"$PY" -m mmm_orch.reference docs/reference --check || failed=1
NO_MKDOCS_2_WARNING=1 "$BIN/mkdocs" build --strict --quiet --site-dir "$(mktemp -d)" || failed=1
run() {  # pytest, where "no test selected" (exit 5, e.g. a file without serial tests) is fine;
    # a failure in one phase still lets the other run, and the script fails at the end.
    "$PY" -m pytest -q "$@" || { rc=$?; [[ $rc -eq 5 ]] || failed=$rc; }
}
if [[ $fast -eq 1 ]]; then
    run -n "${MMM_ORCH_TEST_WORKERS:-$(nproc)}" --dist loadgroup --no-loadscope-reorder --durations=40 "$@"
else
    run -m serial -p no:xdist "$@"
    run -m "not serial" -n "${MMM_ORCH_TEST_WORKERS:-6}" --dist loadgroup --no-loadscope-reorder --durations=40 "$@"
fi
exit "$failed"
