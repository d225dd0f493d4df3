"""Remote execution over SSH, against a real sshd on 127.0.0.1 in front of the real Slurm cluster
(scripts/slurm-cluster.sh up; run as root):

1. `logs --follow` latency: a writer appends a timestamped line every 0.5 s to a log on the
   "login node"; the delay until mmm-orch's follower (paramiko SFTP, polling) prints it, beside
   OpenSSH `ssh HOST tail -F` over the same sshd.
2. `status` of 200 remote jobs (submitted held, so they stay queued): wall time, SSH connections
   and squeue calls per refresh, beside one `ssh HOST squeue --jobs=...` with OpenSSH.

    python benchmarks/remote.py [--jobs 200] [--lines 40]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def start_sshd(root: Path) -> tuple[int, Path]:
    for name in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / name)], check=True)
    (root / "authorized_keys").write_text((root / "client.pub").read_text())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (root / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {root}/host\nPubkeyAuthentication yes\n"
        f"PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
        f"AuthorizedKeysFile {root}/authorized_keys\nStrictModes no\nUsePAM no\n"
        f"PidFile {root}/sshd.pid\nLogLevel VERBOSE\nSubsystem sftp internal-sftp\n")
    Path("/run/sshd").mkdir(exist_ok=True)
    subprocess.run(["/usr/sbin/sshd", "-f", str(root / "sshd_config"), "-E", str(root / "sshd.log")], check=True)
    home = root / "home"
    (home / ".ssh").mkdir(parents=True)
    host_key = " ".join((root / "host.pub").read_text().split()[:2])
    (home / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key}\n")
    (home / ".ssh" / "config").write_text(
        f"Host login\n  HostName 127.0.0.1\n  Port {port}\n  User root\n  IdentityFile {root}/client\n"
        f"  UserKnownHostsFile {home}/.ssh/known_hosts\n")
    return port, home


def follow_latency(root: Path, env: dict, lines: int) -> dict:
    """Seconds from a line's write to its appearance on the follower's stdout."""
    log = root / "remote-jobs" / "follow.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    code = ("import sys, time\nfrom mmm_orch.hosts import host_for\nfrom mmm_orch.progress import logs\n"
            f"stop = time.monotonic() + {lines * 0.5 + 5}\n"
            f"for chunk in logs.follow(host_for('login'), {str(log)!r}, lambda: time.monotonic() > stop):\n"
            "    sys.stdout.write(chunk.decode()); sys.stdout.flush()\n")
    peers = {"mmm-orch (paramiko SFTP, 0.25 s poll)": [sys.executable, "-c", code],
             "OpenSSH ssh tail -F": ["ssh", "-F", str(Path(env["HOME"]) / ".ssh" / "config"), "login",
                                     "tail", "-n", "0", "-F", str(log)]}
    results = {}
    for name, cmd in peers.items():
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        time.sleep(2.0)  # connected and waiting
        delays: list[float] = []

        def read():
            for line in proc.stdout:
                if line.startswith("t="):
                    delays.append(time.time() - float(line[2:]))
                    if len(delays) == lines:
                        return

        reader = threading.Thread(target=read)
        reader.start()
        with open(log, "a") as handle:
            for _ in range(lines):
                handle.write(f"t={time.time():.6f}\n")
                handle.flush()
                time.sleep(0.5)
        reader.join(timeout=10)
        proc.kill()
        results[name] = {"lines": len(delays), "median_s": statistics.median(delays),
                         "p95_s": sorted(delays)[int(0.95 * (len(delays) - 1))], "max_s": max(delays)}
    return results


def remote_status(root: Path, env: dict, jobs: int) -> dict:
    work = root / "work"
    machines = work / ".mmm-orch" / "machines"
    machines.mkdir(parents=True)
    calls = root / "calls.log"
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for command in ("squeue", "sacct"):
        real = shutil.which(command)
        (bin_dir / command).write_text(f'#!/bin/bash\necho "{command}" >> {calls}\nexec {real} "$@"\n')
        (bin_dir / command).chmod(0o755)
    (machines / "slurm-ssh.yaml").write_text(
        f"extends: slurm-local\nname: slurm-ssh\nlogin_hosts: [login]\nremote_jobs_dir: {root}/remote-jobs\n"
        f"scheduler: {{commands: {{query: {bin_dir}/squeue, accounting: {bin_dir}/sacct}}}}\n"
        "directives: ['--nodes={nodes}', '--ntasks-per-node={ranks_per_node}', "
        "'--cpus-per-task={cpus_per_rank}', '--hold']\n")
    mmm = [sys.executable, "-m", "mmm_orch"]
    start = time.monotonic()
    for _ in range(jobs):
        subprocess.run([*mmm, "submit", "slurm-ssh", "dist_check", "--host", "login"], cwd=work, env=env,
                       check=True, capture_output=True)
    submit_s = (time.monotonic() - start) / jobs
    ids = json.loads(subprocess.run([*mmm, "status", "--all", "--json"], cwd=work, env=env, check=True,
                                    capture_output=True, text=True).stdout)
    native = [row["native_id"] for row in ids]
    try:
        wall, conns, squeues = [], [], []
        for _ in range(10):
            calls.write_text("")
            before = (root / "sshd.log").read_text().count("Accepted publickey")
            start = time.monotonic()
            out = subprocess.run([*mmm, "status", "--all", "--json"], cwd=work, env=env, check=True,
                                 capture_output=True, text=True).stdout
            wall.append(time.monotonic() - start)
            assert len(json.loads(out)) == jobs
            conns.append((root / "sshd.log").read_text().count("Accepted publickey") - before)
            squeues.append(calls.read_text().count("squeue"))
        ssh_wall = []
        for _ in range(10):
            start = time.monotonic()
            # The same login-shell wrapping mmm-orch uses, so both find squeue the same way.
            squeue = f"squeue --noheader '--format=%A|%T|%r' --jobs={','.join(native)}"
            subprocess.run(["ssh", "-F", str(Path(env["HOME"]) / ".ssh" / "config"), "login",
                            f"bash -lc {shlex.quote(squeue)}"], env=env, check=True, capture_output=True)
            ssh_wall.append(time.monotonic() - start)
    finally:
        subprocess.run(["scancel", *native], capture_output=True)
    return {"jobs": jobs, "submit_over_ssh_s_each": submit_s,
            "mmm_orch_status_median_s": statistics.median(wall),
            "ssh_connections_per_status": max(conns), "squeue_calls_per_status": max(squeues),
            "openssh_squeue_median_s": statistics.median(ssh_wall)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--lines", type=int, default=40)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="mmm-bench-remote-"))
    port, home = start_sshd(root)
    env = {**os.environ, "HOME": str(home), "XDG_STATE_HOME": str(root / "state"),
           "XDG_CACHE_HOME": str(root / "cache"), "XDG_CONFIG_HOME": str(root / "config")}
    env.pop("SSH_AUTH_SOCK", None)
    try:
        report = {"follow": follow_latency(root, env, args.lines),
                  "status": remote_status(root, env, args.jobs)}
    finally:
        os.kill(int((root / "sshd.pid").read_text()), 15)
    (ROOT / "benchmarks" / "results" / "remote.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
