"""The test sshd as the tests reach it (the `sshd` fixture, tests/conftest.py, starts it): its
keys and log, and a user's ~/.ssh/config naming it."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Sshd:
    """A real sshd on 127.0.0.1 with keys made for the test session."""

    port: int
    pid: int
    host_key_pub: str       # "ssh-ed25519 AAAA..."
    client_key: Path        # authorized for root
    other_key: Path         # not authorized
    log: Path

    def known_hosts_line(self) -> str:
        return f"[127.0.0.1]:{self.port} {self.host_key_pub}\n"

    def sessions(self) -> list:
        """The per-connection sshd processes (children of the listener)."""
        import psutil

        return psutil.Process(self.pid).children()

    def accepted(self) -> int:
        return self.log.read_text().count("Accepted publickey")


def ssh_config(home: Path, sshd: Sshd, alias: str = "login", key: Path | None = None,
               known_hosts: str | None = None) -> None:
    """~/.ssh/config naming the test sshd `alias`, with its own known_hosts file."""
    ssh = home / ".ssh"
    ssh.mkdir(parents=True, exist_ok=True, mode=0o700)
    (ssh / "known_hosts_test").write_text(sshd.known_hosts_line() if known_hosts is None else known_hosts)
    (ssh / "config").write_text(
        f"Host {alias}\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User root\n"
        f"  IdentityFile {key or sshd.client_key}\n  UserKnownHostsFile {ssh / 'known_hosts_test'}\n")


def machine_through_login(work: Path, sshd: Sshd, base: str, remote_jobs: Path) -> str:
    """A user profile `<base>-ssh`: the machine `base` reached through the test sshd (alias
    `login`, in ~/.ssh/config), its job directories under `remote_jobs`; its name."""
    ssh_config(Path(os.environ["HOME"]), sshd)
    name = f"{base.removesuffix('-local')}-ssh"
    machines = work / ".mmm-orch" / "machines"
    machines.mkdir(parents=True, exist_ok=True)
    (machines / f"{name}.yaml").write_text(
        f"extends: {base}\nname: {name}\nlogin_hosts: [login]\nremote_jobs_dir: {remote_jobs}\n")
    return name
