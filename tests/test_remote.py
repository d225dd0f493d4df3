"""Remote submission through a real sshd on 127.0.0.1 in front of the real Slurm cluster: every
scheduler command, file write and log read goes over paramiko. One job runs (the one whose log
is followed); the others are held or parked, since submitting, querying and cancelling them over
SSH is what is tested."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from helpers.jobs import assert_nothing_recorded, wait_state
from helpers.schedulers import command_wrappers
from helpers.ssh import machine_through_login, ssh_config
from mmm_orch.records.db import JobDB

pytestmark = pytest.mark.usefixtures("slurm_cluster", "leftovers_cancelled")


@pytest.fixture
def remote(isolated, sshd, tmp_path):
    """A Slurm profile reached through the test sshd (alias `login`), job dirs under tmp_path."""
    remote_root = tmp_path / "remote-jobs"
    machine_through_login(isolated, sshd, "slurm-local", remote_root)
    return remote_root


def db() -> JobDB:
    return JobDB(Path(os.environ["XDG_STATE_HOME"]) / "mmm-orch" / "jobs.db")


def test_status_of_many_remote_jobs_is_one_connection_and_one_squeue_and_cancel_works(
        cli, remote, sshd, tmp_path):
    # Real jobs submitted held (sbatch --hold: they never run), queried through a counting
    # squeue wrapper, then cancelled over SSH.
    calls = tmp_path / "calls.log"
    command_wrappers(tmp_path / "bin", ["squeue", "sacct"], calls)
    profile = remote.parent / "work" / ".mmm-orch" / "machines" / "slurm-ssh.yaml"
    profile.write_text(profile.read_text() + f"scheduler: {{commands: {{query: {tmp_path}/bin/squeue, "
                       f"accounting: {tmp_path}/bin/sacct}}}}\n"
                       "directives: ['--nodes={nodes}', '--ntasks-per-node={ranks_per_node}', "
                       "'--cpus-per-task={cpus_per_rank}', '--hold']\n")
    jobs = [str(job) for job in range(1, 6)]
    for _ in jobs:
        assert cli("submit", "slurm-ssh", "dist_check", "--host", "login").code == 0
    calls.write_text("")
    before = sshd.accepted()
    result = cli("status", "--all", "--json")
    assert result.code == 0, result.err
    rows = json.loads(result.out)
    assert len(rows) == len(jobs) and {r["state"] for r in rows} == {"pending"}
    assert sshd.accepted() == before + 1
    assert calls.read_text().count("squeue ") == 1 and "sacct" not in calls.read_text()
    cancelled = cli("cancel", *jobs)
    assert cancelled.code == 0, cancelled.err
    assert {wait_state(cli, int(job))["state"] for job in jobs} == {"cancelled"}


@pytest.mark.starts_first
def test_submit_then_logs_follow_survives_a_dropped_connection(cli, remote, sshd, tmp_path):
    # A job whose first rank prints a numbered line every 0.2 s, and from tick 10 on only once the
    # test has dropped the connections (so the follower is mid-stream, however loaded the host).
    probe = tmp_path / "ticker.py"
    go = tmp_path / "go"
    probe.write_text("import os, pathlib, time\nfor i in range(60):\n"
                     f"    while i == 10 and not pathlib.Path({str(go)!r}).exists():\n"
                     "        time.sleep(0.1)\n"
                     "    if os.environ['SLURM_PROCID'] == '0':\n        print(f'tick {i}', flush=True)\n"
                     "    time.sleep(0.2)\n")
    specs = remote.parent / "work" / ".mmm-orch" / "workloads"
    specs.mkdir(parents=True)
    (specs / "ticker.yaml").write_text("name: ticker\ntrainer: ticker\nwatchdog: {enabled: false}\n")
    before = sshd.accepted()
    result = cli("submit", "slurm-ssh", "ticker", "--host", "login", "--env",
                 f"PYTHONPATH={tmp_path}")
    assert result.code == 0, result.err
    assert sshd.accepted() == before + 1  # one connection for the whole submit
    record = db().get(1)
    assert record.remote == "login" and record.host == "login"
    job_dir = Path(record.job_dir)
    assert job_dir.parent == remote and stat.S_IMODE(job_dir.stat().st_mode) == 0o700
    assert (job_dir / "job.sh").read_text() == record.script  # uploaded over SFTP
    assert 'cd "${SLURM_SUBMIT_DIR}"' in record.script and record.submit_dir == str(job_dir)

    follower = subprocess.Popen([sys.executable, "-m", "mmm_orch", "logs", "1", "--follow"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    guard = threading.Timer(600, follower.kill)  # (the job may queue behind other tests)
    guard.start()
    try:
        text = line = follower.stdout.readline()
        while not line.startswith("tick "):
            line = follower.stdout.readline()
            assert line, follower.stderr.read()
            text += line
        before = sshd.accepted()
        for session in sshd.sessions():  # the server side drops every connection
            session.kill()
        go.touch()
        text += follower.stdout.read()  # (the same buffered reader: nothing read is skipped)
        err = follower.stderr.read()
        follower.wait()
    finally:
        guard.cancel()
        follower.kill()
    assert follower.returncode == 0, err
    assert "reconnecting" in err and sshd.accepted() > before
    ticks = [line for line in text.splitlines() if line.startswith("tick ")]
    assert ticks == [f"tick {i}" for i in range(60)], text  # nothing lost, nothing twice

    row = wait_state(cli, 1)
    assert (row["state"], row["exit_code"]) == ("completed", 0)
    logs = cli("logs", "1")
    assert logs.code == 0 and "tick 59" in logs.out, logs.out[-2000:]
    assert cli("logs", "1", "--tail", "1").out.strip() == logs.out.strip().splitlines()[-1]


def test_unknown_host_key_is_refused_and_nothing_is_left(cli, remote, sshd):
    ssh_config(Path(os.environ["HOME"]), sshd, known_hosts="")
    result = cli("submit", "slurm-ssh", "dist_check", "--host", "login")
    assert result.code == 2
    assert "host key of [127.0.0.1]" in result.err and "is not known" in result.err
    assert "ssh-keyscan -p" in result.err and len(result.err.splitlines()) == 1
    assert "SHA256:" in result.err
    assert not Path(os.environ["XDG_STATE_HOME"]).exists() and not remote.exists()
    assert (Path(os.environ["HOME"]) / ".ssh" / "known_hosts_test").read_text() == ""  # not added


def test_changed_host_key_is_refused(cli, remote, sshd, tmp_path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "impostor")],
                   check=True)
    impostor = " ".join((tmp_path / "impostor.pub").read_text().split()[:2])
    ssh_config(Path(os.environ["HOME"]), sshd, known_hosts=f"[127.0.0.1]:{sshd.port} {impostor}\n")
    result = cli("submit", "slurm-ssh", "dist_check", "--host", "login")
    assert result.code == 2 and "has CHANGED" in result.err and "ssh-keygen -R" in result.err
    assert not Path(os.environ["XDG_STATE_HOME"]).exists() and not remote.exists()


def test_wrong_key_is_refused_and_nothing_is_recorded(cli, remote, sshd):
    ssh_config(Path(os.environ["HOME"]), sshd, key=sshd.other_key)
    result = cli("submit", "slurm-ssh", "dist_check", "--host", "login")
    assert result.code == 2
    assert "authentication as root@127.0.0.1 failed" in result.err and str(sshd.other_key) in result.err
    assert not Path(os.environ["XDG_STATE_HOME"]).exists() and not remote.exists()


def test_rejected_remote_submission_leaves_no_record_and_no_remote_directory(cli, remote):
    profile = remote.parent / "work" / ".mmm-orch" / "machines" / "slurm-ssh.yaml"
    profile.write_text(profile.read_text()
                       + "queues: [{name: nosuchpartition, max_nodes: 2, max_walltime: '01:00:00'}]\n")
    result = cli("submit", "slurm-ssh", "dist_check", "--host", "login")
    assert result.code == 2, result.err
    assert "sbatch: error: invalid partition specified: nosuchpartition" in result.err
    assert_nothing_recorded()
    assert not remote.exists() or not any(remote.iterdir())


def test_proxyjump_goes_through_the_jump_host(cli, remote, sshd):
    # `jumped` is reached through `login` (both this sshd): two SSH connections, each with its
    # own host key check, the second tunnelled through the first. The job waits in the parked
    # partition (it never runs), then is cancelled through the same two hops.
    home = Path(os.environ["HOME"])
    config = home / ".ssh" / "config"
    config.write_text(config.read_text() + config.read_text().replace("Host login", "Host jumped")
                      + "  ProxyJump login\n")
    before = sshd.accepted()
    result = cli("submit", "slurm-ssh", "dist_check", "--host", "jumped", "-q", "parked")
    assert result.code == 0, result.err
    assert sshd.accepted() == before + 2
    assert "Accepted publickey for root from 127.0.0.1" in sshd.log.read_text()
    assert wait_state(cli, 1, ("pending",))["state"] == "pending"
    assert cli("cancel", "1").code == 0
    assert wait_state(cli, 1)["state"] == "cancelled"
