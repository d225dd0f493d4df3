#!/usr/bin/env bash
# Install mmm-orch into its own virtual environment, .venv (never the machine's own Python),
# with the training and test extras. torch is pinned: `pip install torch==2.13.0` (a CPU wheel
# here); never an unpinned torch. Idempotent: a second run with the same pyproject.toml does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${MMM_ORCH_VENV:-.venv}
if [[ ! -x $VENV/bin/python ]]; then
    "$PY" -m venv "$VENV"
fi
# What was installed, as a stamp: the same project files and Python need no pip run (a check
# of an editable install costs 10-20 s of the developer's loop).
stamp=$VENV/.mmm-orch-installed
wanted="torch==2.13.0 $(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)"
if [[ $(cat "$stamp" 2>/dev/null) != "$wanted" ]]; then
    pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
    "${pip[@]}" torch==2.13.0
    "${pip[@]}" -e ".[train,test,plot,data,tensorboard,wandb,docs]"
    echo "$wanted" >"$stamp"
fi
# mmm-orch's own modules byte-compiled (an editable install leaves that to each Python): where
# PYTHONDONTWRITEBYTECODE is set, every Python a job or a test starts compiled them anew, a third
# of a dry run's 0.21 s. Quick when nothing changed.
"$VENV/bin/python" -m compileall -q -j 0 mmm_orch tests >/dev/null
# The report tests open report.html in a real headless browser: Debian's Chromium.
if ! command -v chromium >/dev/null 2>&1 && [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "installing chromium (Debian package) for the report tests" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
             --no-install-recommends chromium >/dev/null; }
fi
echo "mmm-orch installed in $VENV: run $VENV/bin/mmm-orch, or 'source $VENV/bin/activate' first" >&2
