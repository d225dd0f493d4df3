"""The test schedulers seen from outside mmm-orch: where the PBS server's commands are, the lock
under which a test changes a scheduler's rules, a user's own PBS batch job, and PATH wrappers
that record each call of a scheduler's commands."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
from pathlib import Path

PBS_BIN = "/opt/pbs/bin"  # where the test server's commands are; not on PATH (as on a login node)


@contextlib.contextmanager
def scheduler_script_held(name: str):
    """The lock scripts/NAME.sh runs under (lib.sh run_locked), held: a test that changes the
    scheduler's rules holds it, so that another worker's `up`, which sets them afresh, waits
    until the test has put them back."""
    with open(f"/run/mmm-orch-{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def command_wrappers(directory: Path, commands: list[str], log: Path) -> str:
    """A PATH prefix whose `commands` record each call in `log`, then run the real command."""
    directory.mkdir(parents=True, exist_ok=True)
    for command in commands:
        real = subprocess.run(["bash", "-c", f"command -v {command}"], capture_output=True,
                              text=True).stdout.strip()
        wrapper = directory / command
        wrapper.write_text(f'#!/bin/bash\necho "{command} $*" >> {log}\nexec {real} "$@"\n')
        wrapper.chmod(0o755)
    return f"{directory}{os.pathsep}{os.environ['PATH']}"


def qsub_own_script(where: Path, nodes: int, command: str) -> Path:
    """Submit, as a user's own PBS batch script would, `command` on `nodes` vnodes of the test
    server, in `where` with this test's state and config dirs; returns the job's output file."""
    env = {k: os.environ[k] for k in ("HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME")}
    exports = "".join(f"export {k}={v}\n" for k, v in env.items())
    script = where / "mine.sh"
    script.write_text(f"#!/bin/bash\n#PBS -l select={nodes}:ncpus=2\n#PBS -l place=scatter\n"
                      f"#PBS -j oe\n#PBS -o {where}/pbs.out\n#PBS -l walltime=00:10:00\n"
                      f"{exports}cd {where}\n{command}\n")
    submitted = subprocess.run([f"{PBS_BIN}/qsub", str(script)], capture_output=True, text=True,
                               timeout=30)
    assert submitted.returncode == 0, submitted.stderr
    return where / "pbs.out"
