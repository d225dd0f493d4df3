"""SSH to a machine's login node with paramiko: the same verbs as running here (commands, private
directories, file writes, incremental reads), over one connection per mmm-orch command.

Follows ~/.ssh/config (HostName, User, Port, IdentityFile, ProxyJump, UserKnownHostsFile), uses
the agent and the usual key files, answers keyboard-interactive prompts (one-time passwords) on the
terminal, and checks the host key against known_hosts: an unknown or changed key is refused, never
added.
"""

from __future__ import annotations

import base64
import contextlib
import getpass
import hashlib
import os
import re
import shlex
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

from mmm_orch.errors import MmmError, SchedulerUnavailable
from mmm_orch.hosts.transport import CommandResult
from mmm_orch.limits import ENV_NAME

DEFAULT_IDENTITIES = ("id_ed25519", "id_ecdsa", "id_rsa")


class SshError(MmmError):
    """Refused host key, failed authentication, bad target: the user must act, exit code 2."""


@dataclass(frozen=True)
class Endpoint:
    """One SSH hop as ~/.ssh/config resolves it."""

    target: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...] = ()
    proxy_jump: str = ""
    known_hosts: tuple[str, ...] = field(default_factory=tuple)

    @property
    def known_hosts_name(self) -> str:
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


# What a user and a host name may be: ~/.ssh/config puts them into shell commands (`Match exec`
# with %h, %r, %u, which paramiko runs through a shell), so shell syntax is refused, as OpenSSH 9.6
# does; a leading '-' would read as an option.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def check_target(target: str) -> str:
    """`[user@]host[:port]` of plain names, or SshError naming it and what is allowed."""
    user, at, rest = target.rpartition("@")
    host, colon, port = rest.partition(":")
    if not (
        _NAME.fullmatch(host)
        and (not at or _NAME.fullmatch(user))
        and (not colon or (port.isascii() and port.isdigit()))
    ):
        raise SshError(
            f"login host {target!r} is invalid: [user@]host[:port], user and host of "
            "letters, digits, '_', '.', '-' (not starting with '-')"
        )
    return target


def resolve(target: str) -> Endpoint:
    """`[user@]host[:port]` or a Host alias, through ~/.ssh/config."""
    user, _, rest = target.rpartition("@")
    host, port = rest, None
    if rest.count(":") == 1:
        host, port_text = rest.split(":")
        if not (port_text.isascii() and port_text.isdigit()):  # "²" is a digit to isdigit
            raise SshError(f"--host {target!r}: port {port_text!r} is not a number")
        port = int(port_text)
    if not host:
        raise SshError(f"--host {target!r}: no host name")
    config_path = Path.home() / ".ssh" / "config"
    options: dict = {}
    if config_path.is_file():
        options = paramiko.SSHConfig.from_path(str(config_path)).lookup(host)
    known = options.get("userknownhostsfile", "~/.ssh/known_hosts ~/.ssh/known_hosts2").split()
    return Endpoint(
        target=target,
        hostname=options.get("hostname", host),
        port=port or int(options.get("port", 22)),
        user=user or options.get("user") or getpass.getuser(),
        identity_files=tuple(os.path.expanduser(p) for p in options.get("identityfile", [])),
        proxy_jump="" if options.get("proxyjump", "none") == "none" else options["proxyjump"],
        known_hosts=tuple(os.path.expanduser(p) for p in known) + ("/etc/ssh/ssh_known_hosts",),
    )


def fingerprint(key: paramiko.PKey) -> str:
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


def _known_keys(endpoint: Endpoint) -> dict[str, paramiko.PKey]:
    keys = paramiko.HostKeys()
    for path in endpoint.known_hosts:
        if os.path.isfile(path):
            keys.load(path)
    found = keys.lookup(endpoint.known_hosts_name)
    return dict(found) if found else {}


def check_host_key(endpoint: Endpoint, key: paramiko.PKey, known: dict[str, paramiko.PKey]) -> None:
    name = endpoint.known_hosts_name
    offered = f"{key.get_name()} {fingerprint(key)}"
    files = ", ".join(p for p in endpoint.known_hosts if not p.startswith("/etc/")) or "known_hosts"
    if not known:
        port = f"-p {endpoint.port} " if endpoint.port != 22 else ""
        host = shlex.quote(endpoint.hostname)  # ~/.ssh/config's HostName, in a command to paste
        raise SshError(
            f"host key of {name} is not known ({offered}); refusing to connect. Check that "
            f"fingerprint against the one the facility publishes, then trust it with "
            f"`ssh {port}{host}` (answer yes) or `ssh-keyscan {port}{host} >> ~/.ssh/known_hosts`"
        )
    if known.get(key.get_name()) != key:
        raise SshError(
            f"host key of {name} has CHANGED ({offered} is not the key in {files}); refusing to "
            f"connect. This may be an attack, or the host was reinstalled: ask the facility, "
            f"then remove the old entry with `ssh-keygen -R {shlex.quote(name)}` and connect again"
        )


def _prompt_handler(title: str, instructions: str, prompts: list[tuple[str, bool]]) -> list[str]:
    """keyboard-interactive: ask on the terminal, as ssh does (one-time passwords, PINs)."""
    if not prompts:
        return []
    if not sys.stdin.isatty():
        raise SshError(
            "the login host asks for keyboard-interactive input (a one-time password?) "
            "but there is no terminal to ask on; run mmm-orch from a terminal"
        )
    for text in (title, instructions):
        if text.strip():
            print(text.strip(), file=sys.stderr)
    return [input(p) if echo else getpass.getpass(p) for p, echo in prompts]


def _load_keys(endpoint: Endpoint) -> list[tuple[str, paramiko.PKey]]:
    keys: list[tuple[str, paramiko.PKey]] = []
    if os.environ.get("SSH_AUTH_SOCK"):
        keys += [("agent key", k) for k in paramiko.Agent().get_keys()]
    paths = endpoint.identity_files or tuple(
        str(Path.home() / ".ssh" / name) for name in DEFAULT_IDENTITIES
    )
    for path in paths:
        if not os.path.isfile(path):
            continue
        try:
            keys.append((path, paramiko.PKey.from_path(path)))
        except paramiko.PasswordRequiredException:
            if sys.stdin.isatty():
                keys.append(
                    (
                        path,
                        paramiko.PKey.from_path(path, getpass.getpass(f"Passphrase for {path}: ")),
                    )
                )
        except (paramiko.SSHException, ValueError, OSError) as exc:
            print(f"[mmm-orch] ssh: cannot read key {path}: {exc}", file=sys.stderr)
    return keys


def _authenticate(transport: paramiko.Transport, endpoint: Endpoint) -> None:
    user = endpoint.user
    try:
        transport.auth_none(user)
        return
    except paramiko.BadAuthenticationType as exc:
        allowed = list(exc.allowed_types)
    tried = []
    if "publickey" in allowed:
        for name, key in _load_keys(endpoint):
            tried.append(name)
            try:
                remaining = transport.auth_publickey(user, key)
            except paramiko.AuthenticationException:
                continue
            if transport.is_authenticated():
                return
            allowed = list(remaining)  # partial success: a second factor follows
            break
    if "keyboard-interactive" in allowed:
        with contextlib.suppress(paramiko.AuthenticationException):
            transport.auth_interactive(user, _prompt_handler)
        if transport.is_authenticated():
            return
    raise SshError(
        f"ssh {endpoint.target}: authentication as {user}@{endpoint.hostname} failed "
        f"(server allows {', '.join(allowed) or 'nothing'}; keys tried: "
        f"{', '.join(tried) or 'none'})"
    )


def _open_socket(endpoint: Endpoint, timeout: float, hops: list[paramiko.Transport]):
    """A socket to the endpoint, through its ProxyJump chain when it has one (each jump is an SSH
    connection of its own, with its own host key check; `hops` keeps them open)."""
    if not endpoint.proxy_jump:
        try:
            return socket.create_connection((endpoint.hostname, endpoint.port), timeout=timeout)
        except OSError as exc:
            raise SchedulerUnavailable(
                f"ssh {endpoint.target}: cannot reach {endpoint.hostname}:{endpoint.port}: {exc}"
            ) from exc
    jumps = [resolve(jump.strip()) for jump in endpoint.proxy_jump.split(",")]
    sock = _open_socket(jumps[0], timeout, hops)
    for i, jump in enumerate(jumps):
        hops.append(_start(jump, sock, timeout))
        following = jumps[i + 1] if i + 1 < len(jumps) else endpoint
        sock = hops[-1].open_channel(
            "direct-tcpip", (following.hostname, following.port), ("127.0.0.1", 0), timeout=timeout
        )
    return sock


def _start(endpoint: Endpoint, sock, timeout: float) -> paramiko.Transport:
    transport = paramiko.Transport(sock)
    known = _known_keys(endpoint)
    if known:
        # Ask for a key type we know for this host, as OpenSSH does, so that a known host is
        # not refused only because the server prefers another type.
        supported = transport.get_security_options().key_types
        transport.get_security_options().key_types = [t for t in supported if t in known] + [
            t for t in supported if t not in known
        ]
    try:
        transport.start_client(timeout=timeout)
        check_host_key(endpoint, transport.get_remote_server_key(), known)
        _authenticate(transport, endpoint)
    except paramiko.SSHException as exc:
        transport.close()
        raise SchedulerUnavailable(f"ssh {endpoint.target}: {exc}") from exc
    except BaseException:
        transport.close()
        raise
    transport.set_keepalive(15)
    return transport


class SshHost:
    """A login node reached over SSH. Connects on first use; `close()` at the end of the command."""

    def __init__(self, target: str, connect_timeout: float = 20):
        self.target = check_target(target)
        self.endpoint = resolve(target)
        self.connect_timeout = connect_timeout
        self._transport: paramiko.Transport | None = None
        self._hops: list[paramiko.Transport] = []
        self._sftp: paramiko.SFTPClient | None = None
        self._dropped = False  # a command found the connection lost (and closed it)

    @property
    def name(self) -> str:
        return self.target

    def _connected(self) -> paramiko.Transport:
        if self._transport is None or not self._transport.is_active():
            # Said whichever call notices first: a read here, or a command that closed it.
            if self._transport is not None or self._dropped:
                print(
                    f"[mmm-orch] ssh {self.target}: connection closed; reconnecting",
                    file=sys.stderr,
                )
            self.close()
            self._dropped = False
            sock = _open_socket(self.endpoint, self.connect_timeout, self._hops)
            self._transport = _start(self.endpoint, sock, self.connect_timeout)
        return self._transport

    def _sftp_client(self) -> paramiko.SFTPClient:
        if self._sftp is None or self._transport is None or not self._transport.is_active():
            try:
                sftp = paramiko.SFTPClient.from_transport(self._connected())
                if sftp is None:  # paramiko's answer when the server opens no channel for it
                    raise paramiko.SSHException("no channel opened")
            except paramiko.SSHException as exc:
                raise SchedulerUnavailable(
                    f"ssh {self.target}: no SFTP service ({exc}); mmm-orch "
                    "writes job scripts and reads logs over SFTP"
                ) from exc
            self._sftp = sftp
        return self._sftp

    def close(self) -> None:
        for transport in [self._transport, *reversed(self._hops)]:
            if transport is not None:
                transport.close()
        self._transport, self._hops, self._sftp = None, [], None

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        timeout: float = 30,
        env: dict[str, str] | None = None,
    ) -> CommandResult:
        """Run argv in a login shell (so the site's profile puts the scheduler on PATH); every
        word is quoted, so nothing in it is interpreted by the remote shell."""
        command = shlex.join(argv)
        for name, value in (env or {}).items():
            if not ENV_NAME.fullmatch(name):  # else the remote bash runs it as a command
                raise ValueError(f"environment variable name {name!r}")
            command = f"{name}={shlex.quote(value)} {command}"
        if cwd:
            command = f"cd {shlex.quote(cwd)} && {command}"
        if "\0" in command:  # the remote shell would cut the line there, as exec does here
            raise ValueError(f"a NUL byte in the command line of {argv[0]}")
        try:
            return self._exec(argv, command, timeout)
        except (EOFError, paramiko.SSHException, ConnectionError) as exc:
            self.close()
            self._dropped = True
            raise SchedulerUnavailable(
                f"ssh {self.target}: connection lost running {argv[0]}: {exc}"
            ) from exc

    def _exec(self, argv: Sequence[str], command: str, timeout: float) -> CommandResult:
        channel = self._connected().open_session(timeout=self.connect_timeout)
        channel.settimeout(timeout)
        channel.exec_command(f"bash -lc {shlex.quote(command)}")
        channel.shutdown_write()
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + timeout
        while True:
            if channel.recv_ready():
                out += channel.recv(65536)
            elif channel.recv_stderr_ready():
                err += channel.recv_stderr(65536)
            elif (
                channel.exit_status_ready()
                and not channel.recv_ready()
                and not channel.recv_stderr_ready()
            ):
                break
            elif time.monotonic() > deadline:
                channel.close()
                raise subprocess.TimeoutExpired(list(argv), timeout)
            else:
                time.sleep(0.005)
        code = channel.recv_exit_status()
        channel.close()
        return CommandResult(
            tuple(argv), code, out.decode(errors="replace"), err.decode(errors="replace")
        )

    def home(self) -> str:
        return self._sftp_client().normalize(".")

    def make_private_dir(self, path: str) -> list[str]:
        """mkdir -p with mode 0700 on the new directories; returns them, outermost first."""
        sftp = self._sftp_client()
        created: list[str] = []
        parts = Path(path).parts
        for i in range(1, len(parts) + 1):
            current = str(Path(*parts[:i]))
            try:
                sftp.stat(current)
            except FileNotFoundError:
                sftp.mkdir(current, mode=0o700)
                sftp.chmod(current, 0o700)  # mkdir's mode is filtered by the server's umask
                created.append(current)
        return created

    def write_file(self, path: str, content: str | bytes, mode: int) -> None:
        sftp = self._sftp_client()
        with sftp.open(path, "w") as handle:
            handle.write(content.encode() if isinstance(content, str) else content)
        sftp.chmod(path, mode)

    def read_from(self, path: str, offset: int, limit: int = 1 << 20) -> bytes | None:
        """Up to `limit` bytes from `offset`; None while the file does not exist, and where
        no regular file is (the server would block on a FIFO)."""

        def read() -> bytes | None:
            try:
                if not stat.S_ISREG(self._sftp_client().stat(path).st_mode or 0):
                    return None
                with self._sftp_client().open(path, "rb") as handle:
                    handle.seek(offset)
                    return handle.read(limit)
            except FileNotFoundError:
                return None

        return self._reconnecting(read)

    def size(self, path: str) -> int | None:
        def size() -> int | None:
            try:
                return self._sftp_client().stat(path).st_size
            except FileNotFoundError:
                return None

        return self._reconnecting(size)

    def _reconnecting(self, read, budget: float = 120.0):
        """Run a read; when the connection drops, connect again with backoff, so that
        `logs --follow` outlives a dropped connection or a restarted login node."""
        start, delay = time.monotonic(), 0.25
        while True:
            try:
                return read()
            except (OSError, EOFError, paramiko.SSHException, SchedulerUnavailable) as exc:
                if time.monotonic() - start > budget:
                    raise SchedulerUnavailable(
                        f"ssh {self.target}: connection lost and not "
                        f"restored within {budget:.0f}s: {exc}"
                    ) from exc
                print(
                    f"[mmm-orch] ssh {self.target}: connection lost ({exc or type(exc).__name__});"
                    " reconnecting",
                    file=sys.stderr,
                )
                self.close()
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def remove_tree(self, paths: list[str]) -> None:
        """Remove what make_private_dir created (innermost last in `paths`)."""
        if paths:
            self.run(["rm", "-rf", "--", paths[-1]])
            for directory in reversed(paths[:-1]):
                try:
                    self._sftp_client().rmdir(directory)
                except OSError:
                    break
