"""Running commands here or on a login node: argument lists, never a shell string, each bounded
in time, and the commands safe to repeat retried with bounded backoff on a transient failure.
The scheduler modules and the SSH host both build on it."""

from __future__ import annotations

import math
import os
import re
import select
import selectors
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import IO, Protocol

from mmm_orch.errors import MmmError, SchedulerError, SchedulerUnavailable


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def message(self) -> str:
        """The command's own words: stderr, else stdout, as one line."""
        text = (self.stderr.strip() or self.stdout.strip()).replace("\n", " | ")
        return text[:500]


class Runner(Protocol):
    """Runs a scheduler command here or on a login node (the SSH runner has the same shape);
    `env` adds variables for that command only."""

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        timeout: float = 30,
        env: dict[str, str] | None = None,
    ) -> CommandResult: ...


class LocalRunner:
    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        timeout: float = 30,
        env: dict[str, str] | None = None,
    ) -> CommandResult:
        # Its own process group: a command given up on goes with everything it started (a
        # balance tool's helper, a shell's pipeline), not only its first process.
        with subprocess.Popen(
            list(argv),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, **env} if env else None,
            start_new_session=True,
        ) as proc:
            try:
                stdout, stderr = _output_and_exit(proc, timeout)
            except BaseException:  # a timeout, an interrupt or any other error: the command
                _end_group(proc)  # goes with everything it started
                raise
        return CommandResult(tuple(argv), proc.returncode, _text(stdout), _text(stderr))


# How long a killed group's members may take to die (one in uninterruptible sleep, on a hung
# file system, dies only when its I/O returns: not waited for past this).
GROUP_END_S = 5.0
_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37  # prctl(2) options


def _end_group(proc: subprocess.Popen) -> None:
    """Kill the command's process group and reap it whole: the leader, and the children it
    leaves (they come to this process, made their subreaper for the while). A kill only queues
    the signal, and the leader's exit, all that wait() tells, says nothing of its children:
    returning then left a hung tool's child (`sleep 300 &`) running a moment longer, and then a
    zombie that a container's init may never reap, a process to `kill -0` either way."""
    was = subreaper(None)
    # Made one before the kill: the leader's children come here as it dies.
    adopting = bool(was) or (was is False and subreaper(True) is True)
    try:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # the group is gone: its leader at least
            proc.kill()
        proc.wait()
        deadline = time.monotonic() + GROUP_END_S
        while adopting and time.monotonic() < deadline:
            try:
                if os.waitpid(-proc.pid, os.WNOHANG) == (0, 0):  # one of it is still dying
                    time.sleep(0.005)
            except ChildProcessError:  # none of the group is left
                break
    finally:
        if adopting and was is False:
            subreaper(False)


def subreaper(on: bool | None) -> bool | None:
    """Whether this process is its descendants' subreaper (prctl(2), Linux 3.4 and later: it is
    given their orphans), after making it one or not (`on`) or as it is (None); None where it
    cannot be asked or set."""
    import ctypes  # (only here: a command given up on, a local job's supervisor)

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    if on is not None:
        return on if prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0 else None
    now = ctypes.c_int(0)
    return (
        bool(now.value) if prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(now), 0, 0, 0) == 0 else None
    )


def _output_and_exit(proc: subprocess.Popen[bytes], timeout: float) -> tuple[bytes, bytes]:
    """Both pipes read to their end, then the exit waited for, all within `timeout` seconds
    (subprocess.run's bounded wait would poll with sleeps of 1 ms and up: a command closes its
    pipes an instant before it exits, so a short qsub or sbatch paid a millisecond or more)."""
    deadline = time.monotonic() + timeout
    # LocalRunner opens both with PIPE, so neither is None.
    assert proc.stdout is not None and proc.stderr is not None
    stdout, stderr = proc.stdout, proc.stderr
    chunks: dict[IO[bytes], list[bytes]] = {stdout: [], stderr: []}
    with selectors.PollSelector() as selector:
        for pipe in chunks:
            selector.register(pipe, selectors.EVENT_READ, pipe)
        while selector.get_map():
            ready = selector.select(_left(deadline))
            if _left(deadline) == 0:  # ready or not: a command that never stops writing ends here
                raise subprocess.TimeoutExpired(proc.args, timeout)
            for key, _ in ready:
                chunk = os.read(key.fd, 1 << 16)
                if chunk:
                    chunks[key.data].append(chunk)
                else:
                    selector.unregister(key.fileobj)
    if proc.poll() is None:
        _sleep_until_exit(proc.pid, deadline)
    try:
        proc.wait(timeout=_left(deadline))  # at once if it has exited; without a pidfd it polls
    except subprocess.TimeoutExpired:
        raise subprocess.TimeoutExpired(proc.args, timeout) from None
    return b"".join(chunks[stdout]), b"".join(chunks[stderr])


def _sleep_until_exit(pid: int, deadline: float) -> None:
    """Linux 5.3 and later: a process's pidfd is readable once it has exited. Elsewhere nothing:
    the wait after it polls."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return
    try:
        waiter = select.poll()
        waiter.register(pidfd, select.POLLIN)
        waiter.poll(_left(deadline) * 1000)
    finally:
        os.close(pidfd)


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


def _text(data: bytes) -> str:
    """UTF-8, as the SSH runner reads it, invalid bytes replaced; every line ending a newline
    (as text=True has it)."""
    return data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")


@dataclass(frozen=True)
class Retry:
    """Bounded exponential backoff; `deadline` caps the time spent on all attempts together."""

    attempts: int = 5
    first_delay: float = 1.0
    max_delay: float = 8.0
    deadline: float = 60.0
    timeout: float = 30.0  # one command

    @classmethod
    def from_env(cls, purpose: str) -> Retry:
        """Defaults per purpose; MMM_ORCH_RETRY_DEADLINE shortens or lengthens the budget."""
        base = cls() if purpose == "submit" else cls(attempts=3, deadline=12.0, timeout=15.0)
        text = os.environ.get("MMM_ORCH_RETRY_DEADLINE")
        if text:
            try:
                deadline = float(text)
            except ValueError:
                deadline = math.nan
            if not (math.isfinite(deadline) and deadline > 0):
                raise MmmError(
                    f"MMM_ORCH_RETRY_DEADLINE {text!r} is invalid: seconds, a number "
                    "greater than 0 (e.g. 60)"
                )
            # Leave room for a second attempt within the budget.
            base = replace(base, deadline=deadline, timeout=min(base.timeout, deadline / 2))
        return base


def run_command(
    runner: Runner,
    argv: Sequence[str],
    transient: re.Pattern[str],
    retry: Retry,
    *,
    cwd: str | None = None,
    transient_codes: frozenset[int] = frozenset(),
    env: dict[str, str] | None = None,
) -> CommandResult:
    """Run until the command answers with something other than a transient failure.

    For commands that are safe to repeat (queries, cancels). Returns the result whatever its exit
    code (the caller knows which codes mean what); raises SchedulerUnavailable when every attempt
    within the budget timed out or was transient.
    """
    start = time.monotonic()
    delay = retry.first_delay
    last = ""
    for attempt in range(1, retry.attempts + 1):
        remaining = retry.deadline - (time.monotonic() - start)
        try:
            result = runner.run(
                argv, cwd=cwd, timeout=max(1.0, min(retry.timeout, remaining)), env=env
            )
        except subprocess.TimeoutExpired:
            last = f"no answer within {retry.timeout:g}s"
        except FileNotFoundError as err:
            raise SchedulerError(
                f"{argv[0]}: command not found (is this the machine's login node?)"
            ) from err
        else:
            if result.returncode == 0 or not (
                transient.search(result.stderr)
                or transient.search(result.stdout)
                or result.returncode in transient_codes
            ):
                return result
            last = result.message
        if attempt == retry.attempts or time.monotonic() - start + delay > retry.deadline:
            break
        time.sleep(delay)
        delay = min(delay * 2, retry.max_delay)
    raise SchedulerUnavailable(
        f"{argv[0]} failed {attempt} time(s) in {time.monotonic() - start:.0f}s: {last}"
    )
