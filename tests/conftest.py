"""Shared fixtures: an isolated home and config search path, and an in-process CLI runner."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mmm_orch.cli import main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Every test runs in an empty directory with its own HOME and config dirs."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("MMM_ORCH_PATH", raising=False)
    monkeypatch.delenv("MMM_ORCH_ACCOUNT", raising=False)
    return work


@dataclasses.dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys):
    """Run `mmm-orch ARGS...` in this process; returns exit code, stdout and stderr."""

    def run(*args: str) -> Result:
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse usage errors
            code = exc.code if isinstance(exc.code, int) else 2
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess:
    """Run the CLI in a fresh interpreter (for import checks and real exit codes)."""
    return subprocess.run(
        [sys.executable, "-m", "mmm_orch", *args],
        capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})}, cwd=cwd,
    )


def bash_n(script: str, tmp_path: Path) -> None:
    path = tmp_path / "check.sh"
    path.write_text(script)
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


CLUSTER_SCRIPT = REPO / "scripts" / "slurm-cluster.sh"


@pytest.fixture(scope="session")
def slurm_cluster():
    """The project's real two-node Slurm cluster (scripts/slurm-cluster.sh), started once."""
    if os.geteuid() != 0:
        pytest.skip("REAL SLURM CLUSTER TESTS NOT RUN: they need root to install and start munge, "
                    "MariaDB, slurmdbd, slurmctld and two slurmd (run as root, as CI does)")
    proc = subprocess.run(["bash", str(CLUSTER_SCRIPT), "up"], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"slurm-cluster.sh up failed:\n{proc.stdout}\n{proc.stderr}"
    return CLUSTER_SCRIPT


def write_probe(directory: Path, name: str, body: str, trainer_options: str = "") -> None:
    """A throwaway workload `name` whose trainer is the Python `body` (module on PYTHONPATH)."""
    (directory / f"{name}_probe.py").write_text(body)
    specs = directory / ".mmm-orch" / "workloads"
    specs.mkdir(parents=True, exist_ok=True)
    (specs / f"{name}.yaml").write_text(
        f"name: {name}\ntrainer: {name}_probe\n" + (f"options:\n{trainer_options}" if trainer_options else ""))


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
