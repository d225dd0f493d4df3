"""Where machine profiles, workload specs and templates are looked up.

Search order, first match wins: ./.mmm-orch/<kind>/, then ~/.config/mmm-orch/<kind>/
(or $XDG_CONFIG_HOME), then the copies shipped with the package. $MMM_ORCH_PATH may
prepend more roots (colon-separated), each holding machines/, workloads/, templates/.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from mmm_orch.errors import MmmError

KINDS = ("machines", "workloads", "templates")
MAX_CONFIG_BYTES = 1 << 20  # a profile or spec: the largest packaged one is 15 KiB


def packaged_dir(kind: str) -> Path:
    """The directory shipped with mmm-orch (a symlink to the repository's top level in a checkout)."""
    return Path(__file__).parent / kind


def user_roots() -> list[Path]:
    roots = [Path(p) for p in os.environ.get("MMM_ORCH_PATH", "").split(os.pathsep) if p]
    roots.append(Path.cwd() / ".mmm-orch")
    config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    roots.append(Path(config_home) / "mmm-orch")
    return roots


def search_dirs(kind: str) -> list[Path]:
    """Existing directories for `kind`, highest priority first, the packaged one last."""
    if kind not in KINDS:
        raise ValueError(kind)
    dirs = [root / kind for root in user_roots()]
    dirs.append(packaged_dir(kind))
    found: dict[tuple[int, int], Path] = {}  # a directory reached twice (a link) counts once
    for d in dirs:
        try:
            info = d.stat()
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode):
            found.setdefault((info.st_dev, info.st_ino), d)
    return list(found.values())


def cache_home() -> Path:
    """mmm-orch's cache directory: $XDG_CACHE_HOME/mmm-orch, else ~/.cache/mmm-orch."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "mmm-orch"


def state_home() -> Path:
    """mmm-orch's state directory: $XDG_STATE_HOME/mmm-orch, else ~/.local/state/mmm-orch."""
    root = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(root) / "mmm-orch"


def default_db_path() -> Path:
    """The job database: $MMM_ORCH_DB, else $XDG_STATE_HOME/mmm-orch/jobs.db."""
    if os.environ.get("MMM_ORCH_DB"):
        return Path(os.environ["MMM_ORCH_DB"])
    return state_home() / "jobs.db"


class NotReadable(ValueError):
    """A user's file that is not a regular file, or too large to be what it claims."""


_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def open_regular(path: str | os.PathLike) -> int:
    """A descriptor of the regular file `path`, to read. Opened without blocking and checked on
    the open descriptor, so that a FIFO (which would block the reader forever), a directory or a
    device put there is refused unread: NotReadable; OSError when it cannot be opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = _KINDS.get(stat.S_IFMT(mode), "a special file")
        raise NotReadable(f"{os.fspath(path)} is {kind}, not a regular file")
    return fd


def read_regular(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of a regular file (open_regular) of at most `limit` bytes."""
    fd = open_regular(path)
    try:
        info = os.fstat(fd)
        if info.st_size > limit:
            raise NotReadable(
                f"{os.fspath(path)} is {info.st_size} bytes, above the {limit} this file may have"
            )
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise NotReadable(f"{os.fspath(path)} is above the {limit} bytes this file may have")
    return data


def write_whole(path: str, text: str) -> None:
    """Write `text` to the file `path` (an --out) whole or not at all: a failed write leaves no
    partial file."""
    target = Path(path)
    if target.is_dir() or not target.name:
        raise MmmError(f"--out {path!r}: is a directory; name a file")
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.chmod(0o755)
        tmp.replace(target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise MmmError(f"--out {path!r}: cannot write: {exc.strerror}") from None
