"""Stopping a launched command together with everything it started: its process group."""

from __future__ import annotations

import os
import signal
import subprocess


def signal_group(group: int, signum: int) -> None:
    try:
        os.killpg(group, signum)
    except ProcessLookupError:
        pass


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
