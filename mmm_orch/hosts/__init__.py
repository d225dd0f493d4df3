"""Where a job's scheduler commands run and its files live: here, or a login node over SSH.

Both kinds of host have the same verbs (run a command, make a private directory, write a file,
read a file from an offset), so the schedulers, submit, status and logs never ask which one
they have. One connection per remote host serves a whole mmm-orch command. Beside it:
transport.py (commands as argument lists, bounded in time, retried when transient), ssh.py (the
login node over paramiko, host keys verified) and job_envs.py (the Python a facility's jobs run).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path
from typing import Protocol

from mmm_orch.hosts.transport import LocalRunner, Runner


class Host(Runner, Protocol):
    # Read-only: SshHost gives its target through a property.
    @property
    def name(self) -> str: ...

    def home(self) -> str: ...
    def make_private_dir(self, path: str) -> list[str]: ...
    def write_file(self, path: str, content: str | bytes, mode: int) -> None: ...
    def read_from(self, path: str, offset: int, limit: int = 1 << 20) -> bytes | None: ...
    def size(self, path: str) -> int | None: ...
    def remove_tree(self, created: list[str]) -> None: ...
    def close(self) -> None: ...


class LocalHost(LocalRunner):
    name = "local"

    def home(self) -> str:
        return str(Path.home())

    def make_private_dir(self, path: str) -> list[str]:
        """mkdir -p with mode 0700; returns the directories it created, outermost first."""
        target = Path(path)
        created = [str(p) for p in reversed([target, *target.parents]) if not p.exists()]
        target.mkdir(parents=True, mode=0o700)
        for directory in created:
            os.chmod(directory, 0o700)  # mkdir's mode is filtered by the umask
        return created

    def write_file(self, path: str, content: str | bytes, mode: int) -> None:
        Path(path).write_bytes(content.encode() if isinstance(content, str) else content)
        os.chmod(path, mode)

    def read_from(self, path: str, offset: int, limit: int = 1 << 20) -> bytes | None:
        """Up to `limit` bytes from `offset`; None where no regular file is (a FIFO put in a
        log's place would block the reader forever, a directory has no bytes)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # a socket: no file to read either
                return None
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # (fdopen refuses a directory outright)
            os.close(fd)
            return None
        with os.fdopen(fd, "rb") as handle:
            handle.seek(offset)
            return handle.read(limit)

    def size(self, path: str) -> int | None:
        try:
            return os.path.getsize(path)
        except FileNotFoundError:
            return None

    def remove_tree(self, created: list[str]) -> None:
        """Undo make_private_dir: the innermost directory with its files, then the parents it
        created if they are empty (another process may be using them)."""
        if created:
            shutil.rmtree(created[-1], ignore_errors=True)
            for directory in reversed(created[:-1]):
                try:
                    os.rmdir(directory)
                except OSError:
                    break

    def close(self) -> None:
        pass


_open: dict[str, Host] = {}


def host_for(remote: str) -> Host:
    """The host for a job's `remote` field ('' is here); one instance per target per process."""
    if remote not in _open:
        if remote:
            from mmm_orch.hosts.ssh import SshHost  # paramiko: only where a host is remote

            _open[remote] = SshHost(remote)
        else:
            _open[remote] = LocalHost()
    return _open[remote]


def close_all() -> None:
    while _open:
        _open.popitem()[1].close()
