"""The run directory's files as the runtime reads and writes them: opened only where they are
regular files (a FIFO in their place would block the open or the read forever, a link to
/dev/zero would never end, a link out of the run would be written through), and the checkpoint
`latest` names taken only when they name a checkpoint directory of this run. Pure: no torch."""

from __future__ import annotations

import operator
import os
import stat
from pathlib import Path
from typing import IO, Any, BinaryIO

from mmm_orch.injob import protocol

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class RunFileError(ValueError):
    """A file of the run directory is not what the runtime keeps there (one line, says which)."""


def kind(path: Path) -> str:
    """What `path` is, in words (a link is not followed): "a regular file", "missing", ..."""
    try:
        return _describe(os.lstat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return "missing"


def _describe(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((words for test, words in _KINDS if test(mode)), "not a regular file")


def _open(path: Path, flags: int) -> int:
    """A descriptor of the regular file `path`: no link followed, no wait on a FIFO."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError:
        # ELOOP: a link; ENXIO: a FIFO nobody reads; EISDIR, ENODEV ...: what kind() says
        if (found := kind(path)) in ("missing", "a regular file"):
            raise
        raise RunFileError(f"{path} is {found}, not a regular file") from None
    if not stat.S_ISREG(mode := os.fstat(fd).st_mode):
        os.close(fd)
        raise RunFileError(f"{path} is {_describe(mode)}, not a regular file")
    return fd


def open_write(path: Path, mode: str, encoding: str | None = None) -> IO:
    """`path` opened as open(path, mode) would, for mode "w", "a", "wb" or "ab"."""
    fd = _open(path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in mode else os.O_TRUNC))
    return os.fdopen(fd, mode, encoding=encoding)


def open_read(path: Path) -> BinaryIO:
    """`path` opened to read; FileNotFoundError when missing."""
    return os.fdopen(_open(path, os.O_RDONLY), "rb")


def read_small(path: Path, limit: int) -> bytes | None:
    """The content of `path`, a file of at most `limit` bytes; None when there is none."""
    try:
        handle = open_read(path)
    except FileNotFoundError:
        return None
    with handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise RunFileError(f"{path} is over {limit} bytes: not a file the runtime wrote")
    return data


def step_number(step: Any, what: str = "step") -> int:
    """`step` as an int >= 0: any integer type (a numpy or torch integer from a user's loop),
    never a bool, a float or text; ValueError naming `what` otherwise."""
    try:
        number = operator.index(step) if not isinstance(step, bool) else -1
    except TypeError:
        number = -1
    if number < 0:
        raise ValueError(f"{what} {step!r}: expected an int >= 0")
    return number


def step_dir(run_dir: str | Path, step: int) -> Path:
    """Step `step`'s checkpoint directory in the run (not made)."""
    step = step_number(step, "checkpoint step")
    return Path(run_dir) / protocol.CHECKPOINTS_DIR / protocol.checkpoint_name(step)


def existing_step_dir(run_dir: str | Path, step: int) -> Path:
    """Step `step`'s checkpoint directory, which must be there: a directory of the run itself,
    not a link out of it."""
    path = step_dir(run_dir, step)
    if (found := kind(path)) != "a directory":
        raise RunFileError(f"{path} is {found}, not a checkpoint directory")
    return path


def latest_step(run_dir: str | Path) -> int | None:
    """The step of the run's newest complete checkpoint; None when the run has none (no
    `latest`). RunFileError when `latest` is there but names no checkpoint directory of the run:
    a resume would start over or read what is not its checkpoint."""
    path = Path(run_dir) / protocol.CHECKPOINTS_DIR / protocol.LATEST_CHECKPOINT
    content = read_small(path, 64)  # "step-N"
    if content is None:
        return None
    step = protocol.checkpoint_step(content.decode("utf-8", "replace"))
    if step is None:
        raise RunFileError(f"{path} holds {content[:40]!r}, not the name of a checkpoint (step-N)")
    try:
        existing_step_dir(run_dir, step)
    except RunFileError as exc:
        raise RunFileError(f"{path} names step-{step}, but {exc}") from None
    return step
