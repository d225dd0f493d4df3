"""Stopping a launched command together with everything it started: its process group."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def signal_group(group: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group has ended already
        os.killpg(group, signum)


def stop_group(process: subprocess.Popen, grace: float) -> None:
    """SIGTERM to the group (trainers checkpoint on it), SIGKILL after `grace` seconds, and
    SIGKILL to stragglers left in the group after the leader ended."""
    signal_group(process.pid, signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        signal_group(process.pid, signal.SIGKILL)
        process.wait()
    signal_group(process.pid, signal.SIGKILL)
