#!/usr/bin/env bash
# Install mmm-orch into its own virtual environment, .venv (never the machine's own Python),
# with the training and test extras. torch is pinned: `pip install torch==2.13.0` (a CPU wheel
# here); never an unpinned torch. Idempotent: a second run only checks that all is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${MMM_ORCH_VENV:-.venv}
if [[ ! -x $VENV/bin/python ]]; then
    "$PY" -m venv "$VENV"
fi
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" torch==2.13.0
"${pip[@]}" -e ".[train,test,plot,data,tensorboard,wandb,docs]"
# The report tests open report.html in a real headless browser: Debian's Chromium.
if ! command -v chromium >/dev/null 2>&1 && [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "installing chromium (Debian package) for the report tests" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
             --no-install-recommends chromium >/dev/null; }
fi
echo "mmm-orch installed in $VENV: run $VENV/bin/mmm-orch, or 'source $VENV/bin/activate' first" >&2
