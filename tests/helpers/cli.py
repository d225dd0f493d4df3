"""The command line in a fresh interpreter, as a user runs it: real exit codes, and imports
that an in-process run (the `cli` fixture, tests/conftest.py) would have made already."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the CLI in a fresh interpreter (for import checks and real exit codes). The limit
    catches a hang: a report's figures take over a minute on a 2-core host under full load."""
    return subprocess.run(
        [sys.executable, "-m", "mmm_orch", *args],
        capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})}, cwd=cwd,
    )
