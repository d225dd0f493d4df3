"""Two runs never write one run directory at once: rank 0 holds it, by two guards.

- flock on <run>/.lock, held for the life of the process (the kernel lets it go however the
  process ends). Where flock is coherent across nodes it is all a run needs; but a Lustre
  client mounted without the `flock` option refuses it (`noflock`: ENOSYS), and one mounted
  `localflock` grants it on each node alone (mount.lustre(8); the Lustre manual, "Flock
  Feature": off by default). No facility's user guide says how Flare, Eagle, Orion or
  Perlmutter's scratch are mounted, so flock alone is never trusted.
- a claim file, which needs no lock: <run>/.claim-N, made with O_CREAT|O_EXCL (atomic on Lustre
  and every local file system), naming its holder's job, host, pid and process start time. The
  highest N is the claim in force. A run takes N+1 only once the holder of N is known to have
  ended: it released it (<run>/.claim-N.released, made as it exits), or its process is gone
  from its host (this host), or the scheduler says its job ended; a relaunch of the same job
  (failover) takes over its earlier launch's claim after the wait it is given for its ranks.
  Two runs that find one claim ended race for N+1, and O_EXCL lets one have it.

What may not be told (a holder on another host outside any job, a scheduler that cannot be
asked) is a directory in use: refused in one line that names the holder and the claim."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import re
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from mmm_orch.paths import NotReadable, read_regular

LOCK_FILE = ".lock"
CLAIM_PREFIX = ".claim-"
RELEASED = ".released"
_CLAIM = re.compile(r"\.claim-([0-9]{1,18})")
_MAX_CLAIM_BYTES = 4096
# A claim is made, then written: one that cannot be read yet is a run starting, this long.
_BEING_WRITTEN_S = 10.0


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a run directory: its process (the start time tells it from a later process
    given the same pid) and the scheduler's job it runs in ("" outside one)."""

    host: str
    pid: int
    started: float
    scheduler: str = ""
    job: str = ""

    def said(self) -> str:
        if self is STARTING:
            return "a run that is starting"
        job = f"{self.scheduler} job {self.job}, " if self.job else ""
        return f"{job}host {self.host}, pid {self.pid}"


# The holder of a claim made and not written yet (the run that made it is starting).
STARTING = Holder("", 0, 0.0)


def this_process(environ: Mapping[str, str] | None = None) -> Holder:
    """This process as a holder: its host as the kernel names it (whose processes its pid is
    one of: a test cluster's nodes may share one), and its job's kind and id (schedulers.job_in)."""
    import psutil

    from mmm_orch.schedulers import job_in

    scheduler, job = job_in(environ)
    return Holder(socket.gethostname(), os.getpid(), psutil.Process().create_time(), scheduler, job)


def job_ended(scheduler: str, job: str) -> bool:
    """Whether `scheduler` says job `job` ended; False where it cannot say (not found, not
    reachable from here)."""
    from mmm_orch.errors import MmmError
    from mmm_orch.schedulers import scheduler_for
    from mmm_orch.schedulers.base import JobRef

    try:
        found = scheduler_for(scheduler, {}).query([JobRef(job, Path("."))])
    except (MmmError, OSError):
        return False
    status = found.get(job)
    return status is not None and status.state.terminal


_LOCK: IO[str] | None = None  # held until the process exits
_HELD: Path | None = None  # the claim this process holds


def hold(
    path: Path,
    me: Holder,
    wait_s: float = 0.0,
    say: Callable[[str], None] = print,
    ended: Callable[[str, str], bool] = job_ended,
) -> str:
    """Take the run directory `path` for `me`, waiting up to `wait_s` for a holder to go (a
    relaunch's earlier ranks); why it cannot be had, or "" once held. `say` hears which guards
    hold it."""
    global _LOCK
    deadline = time.monotonic() + wait_s
    try:
        _LOCK = open(path / LOCK_FILE, "a+")  # noqa: SIM115 - the lock is held until exit
    except OSError as exc:
        return f"cannot open {path / LOCK_FILE}: {exc.strerror}"
    locked, why = _flock(_LOCK, me, path, deadline, say)
    if why:
        return why
    waiting = False
    verdicts: dict[tuple[str, str], bool] = {}  # a holder's job is asked about once
    while True:
        try:
            holder = _take(path, me, verdicts, ended, relaunch=wait_s > 0, late=_late(deadline))
        except OSError as exc:  # a claim that cannot be made or listed (read-only, full disk)
            return f"cannot claim the run directory {path}: {exc.strerror}"
        if holder is None:
            assert _HELD is not None
            say(
                f"[runtime] run directory {path} held by its claim {_HELD.name}"
                + (
                    f" and flock on {LOCK_FILE}"
                    if locked is None
                    else f" alone: flock on {LOCK_FILE} failed ({locked}), as on a Lustre "
                    "mount without flock"
                )
            )
            return ""
        if isinstance(holder, str):  # a claim that is no claim of this runtime's
            return holder
        if _late(deadline):
            return (
                f"run directory {path} is in use by another run ({holder.said()}, its claim "
                f"{_claim_in_force(path)}); give this run another --run-name, or remove that "
                "claim once you know that run has ended"
            )
        if not waiting:
            waiting = True
            say(
                f"[runtime] run directory {path} is still claimed by {holder.said()}; waiting "
                f"up to {deadline - time.monotonic():.0f}s for it to stop"
            )
        time.sleep(1)


def _late(deadline: float) -> bool:
    return time.monotonic() >= deadline


def _flock(
    lock: IO[str], me: Holder, path: Path, deadline: float, say: Callable[[str], None]
) -> tuple[str | None, str]:
    """flock on the lock file: (None, "") when held, (why flock failed, "") where the file
    system refuses it, ("", why the run cannot have it) where another run holds it."""
    waiting = False
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            if _late(deadline):
                return "", (
                    f"run directory {path} is in use by another run ({holder}); give this "
                    "run another --run-name"
                )
            if not waiting:
                waiting = True
                say(
                    f"[runtime] run directory {path} is still held by {holder}; waiting "
                    f"up to {deadline - time.monotonic():.0f}s for it to stop"
                )
            time.sleep(1)
            continue
        except OSError as exc:  # ENOSYS on Lustre's noflock, ENOLCK, EOPNOTSUPP ...
            return exc.strerror or errno.errorcode.get(exc.errno or 0, "error"), ""
        with contextlib.suppress(OSError):  # (what it says is for people: a full disk may refuse)
            lock.seek(0)
            lock.truncate()
            lock.write(f"{me.host} {me.pid}\n")
            lock.flush()
        return None, ""


def _generations(path: Path) -> list[int]:
    return sorted(int(m[1]) for name in os.listdir(path) if (m := _CLAIM.fullmatch(name)))


def _claim_in_force(path: Path) -> Path:
    found = _generations(path)
    return path / f"{CLAIM_PREFIX}{found[-1] if found else 0}"


def _take(
    path: Path,
    me: Holder,
    verdicts: dict[tuple[str, str], bool],
    ended: Callable[[str, str], bool],
    relaunch: bool,
    late: bool,
) -> Holder | str | None:
    """One try at the claim: None once taken, else the holder in force (or why its claim is
    no claim: a string)."""
    global _HELD
    while True:
        found = _generations(path)
        last = found[-1] if found else 0
        if last:
            claim = path / f"{CLAIM_PREFIX}{last}"
            if not os.path.lexists(f"{claim}{RELEASED}"):
                try:
                    holder = _read(claim)
                except FileNotFoundError:
                    continue  # taken over and cleaned up since it was listed
                if isinstance(holder, str) or holder is STARTING:
                    return holder
                if not _has_ended(holder, me, verdicts, ended, relaunch, late):
                    return holder
        mine = path / f"{CLAIM_PREFIX}{last + 1}"
        try:
            fd = os.open(mine, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            continue  # another run took it first: look again at who holds it now
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(dataclasses.asdict(me), out)
        except OSError:  # (a full disk): no empty claim left to hold the directory
            os.unlink(mine)
            raise
        _HELD = mine
        for older in found:  # (claims no run can hold any more: one holds a later one)
            for name in (f"{CLAIM_PREFIX}{older}", f"{CLAIM_PREFIX}{older}{RELEASED}"):
                with contextlib.suppress(OSError):  # (gone, or not ours to remove: left)
                    os.unlink(path / name)
        return None


def _read(claim: Path) -> Holder | str:
    """The holder a claim names (STARTING for one still being written), or why it is no claim
    of this runtime's (a string); FileNotFoundError where it went."""
    try:
        text = read_regular(claim, _MAX_CLAIM_BYTES)
    except FileNotFoundError:
        raise
    except (NotReadable, OSError) as exc:  # a FIFO, a directory ...: never waited on
        return _no_claim(claim, type(exc).__name__)
    try:
        data = json.loads(text)
        return Holder(
            host=str(data["host"]),
            pid=int(data["pid"]),
            started=float(data["started"]),
            scheduler=str(data.get("scheduler", "")),
            job=str(data.get("job", "")),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        if time.time() - os.lstat(claim).st_mtime < _BEING_WRITTEN_S:
            return STARTING
        return _no_claim(claim, type(exc).__name__)


def _no_claim(claim: Path, why: str) -> str:
    return (
        f"{claim} is not a claim this runtime wrote ({why}); remove it once you know no run "
        "uses this directory, or give this run another --run-name"
    )


def _has_ended(
    holder: Holder,
    me: Holder,
    verdicts: dict[tuple[str, str], bool],
    ended: Callable[[str, str], bool],
    relaunch: bool,
    late: bool,
) -> bool:
    """Whether `holder` is known to have ended."""
    if holder.host == me.host:  # this host's processes say
        return not _alive(holder.pid, holder.started)
    if holder.job and (holder.scheduler, holder.job) == (me.scheduler, me.job):
        # An earlier launch of this job on other nodes: a relaunch comes once its launcher
        # returned, and has waited the scheduler's kill grace for its ranks.
        return relaunch and late
    if holder.job:
        key = (holder.scheduler, holder.job)
        if key not in verdicts:
            verdicts[key] = ended(*key)
        return verdicts[key]
    return False  # outside any job, on another host: nothing here can tell


def _alive(pid: int, started: float) -> bool:
    import psutil

    try:
        return abs(psutil.Process(pid).create_time() - started) < 0.01
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # (one of another user's: it exists)
        return True


def release() -> None:
    """Mark this process's claim released (as it exits: a later run takes the next one)."""
    if _HELD is not None:
        with contextlib.suppress(OSError):
            os.close(os.open(f"{_HELD}{RELEASED}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
