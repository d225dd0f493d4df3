"""Rendezvous ports: a job or a relaunch never takes a port another one holds, and a rendezvous
that cannot bind its port is a launch fault, relaunched on a fresh port rather than blamed on the
code or a node. The ports are really held (a listening socket) and the ranks really fail to bind:
torch's TCPStore on the live schedulers, a plain bind in the watchdog's own tests."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.jobs import TERMINAL, wait_state
from mmm_orch.injob import protocol, rendezvous

WATCHDOG = [sys.executable, "-m", "mmm_orch.injob.watchdog", "--first-step-timeout", "30",
            "--step-timeout", "30", "--grace", "2", "--"]
# What a rank does at its start: bind MASTER_PORT as the rendezvous store would, then step.
BIND_THEN_STEP = (f"{sys.executable} -c \"import os, socket; s = socket.socket(); "
                  "s.bind(('0.0.0.0', int(os.environ['MASTER_PORT']))); s.listen(); "
                  "print('step=1 port=' + os.environ['MASTER_PORT'], flush=True)\"")


@pytest.fixture
def held_port():
    """A port another job holds: bound and listening on every address of this host."""
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        yield holder.getsockname()[1]


def watch(command: str, port: int, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*WATCHDOG, command], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "MASTER_PORT": str(port)}, cwd=tmp_path)


def test_a_free_port_is_one_this_host_can_bind():
    ports = {rendezvous.free_port() for _ in range(20)}
    for port in ports:
        with socket.socket() as probe:
            probe.bind(("0.0.0.0", port))
    assert len(ports) > 1  # the kernel's choice, not one fixed number


@pytest.mark.slow
def test_a_port_in_use_before_the_first_step_is_relaunched_on_a_fresh_one(held_port, tmp_path):
    proc = watch(BIND_THEN_STEP, held_port, tmp_path)
    assert proc.returncode == 0, proc.stdout
    assert f"{protocol.RENDEZVOUS} port {held_port} was in use before the first step; " \
           "relaunching on port" in proc.stdout
    used = int(proc.stdout.rsplit("port=", 1)[1])
    assert used != held_port


def test_a_port_in_use_after_the_first_step_is_the_code_s_failure(held_port, tmp_path):
    command = f"echo step=1; {BIND_THEN_STEP}"
    proc = watch(command, held_port, tmp_path)
    assert proc.returncode == 1 and protocol.RENDEZVOUS not in proc.stdout


def test_relaunches_are_bounded(tmp_path):
    proc = watch("echo 'OSError: [Errno 98] Address already in use'; exit 1", 1, tmp_path)
    assert proc.returncode == 1
    assert proc.stdout.count("relaunching on port") == rendezvous.TRIES - 1


@pytest.mark.slow
def test_failover_relaunches_a_refused_rendezvous_without_retiring_a_node(held_port, tmp_path):
    (tmp_path / "nodes.txt").write_text("n1\nn2\n")
    proc = subprocess.run(
        [sys.executable, "-m", "mmm_orch.injob.failover", "--dir", str(tmp_path), "--machine",
         "slurm-local", "--active", "1", "--node-arg=--nodelist={nodelist}",
         "--first-step-timeout", "30", "--step-timeout", "30", "--", BIND_THEN_STEP],
        capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "MASTER_PORT": str(held_port)})
    assert proc.returncode == 0, proc.stdout
    assert protocol.RENDEZVOUS in proc.stdout and "retired" not in proc.stdout
    state = json.loads((tmp_path / "failover.json").read_text())
    assert state["attempt"] == 1 and state["retired"] == [] and state["spares"] == ["n2"]


@pytest.mark.parametrize("machine", ["slurm-local", "pbs-local"])
def test_the_test_profiles_ask_the_host_for_a_port(cli, machine):
    script = cli("render", machine, "dist_check", "-N", "2").out
    assert '-m mmm_orch.injob.rendezvous)"' in script and "JOBID" not in script.split("MASTER_PORT=")[1]


@pytest.mark.live
@pytest.mark.parametrize("kind", ["slurm", "pbs"])
def test_a_job_whose_port_is_taken_completes_on_another(request, cli, isolated, held_port, kind,
                                                        leftovers_cancelled):
    """torch's own rendezvous (TCPStore on rank 0) finds its port held by another process of
    this host: the launch is relaunched on a fresh port and the job completes, nothing retired.
    (With spare nodes the failover loop relaunches it the same way, a real loop above.)"""
    request.getfixturevalue({"slurm": "slurm_cluster", "pbs": "pbs_server"}[kind])
    machine = {"slurm": "slurm-local", "pbs": "pbs-local"}[kind]
    result = cli("submit", machine, "dist_check", "-N", "2", "--env", f"MASTER_PORT={held_port}",
                 "--json")
    assert result.code == 0, result.err
    job = json.loads(result.out)["id"]
    row = wait_state(cli, job, TERMINAL, timeout=300)
    log = cli("logs", str(job)).out
    assert row["state"] == "completed" and row["exit_code"] == 0, log[-3000:]
    assert "EADDRINUSE" in log or "ddress already in use" in log, log[-3000:]
    assert f"{protocol.RENDEZVOUS} port {held_port} was in use" in log
    assert "retired" not in log
