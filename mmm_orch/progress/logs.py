"""Read a job's log: tail it, follow it while the job runs, wait for it while the job queues."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from mmm_orch.errors import MmmError

if TYPE_CHECKING:
    from mmm_orch.hosts import Host

# CSI sequences (colours, cursor moves) and OSC sequences (titles, hyperlinks).
ANSI = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def clean(chunk: bytes, strip_ansi: bool) -> str:
    if strip_ansi:
        chunk = ANSI.sub(b"", chunk)
    return chunk.decode("utf-8", errors="replace")


def read(host: Host, path: str, offset: int, limit: int = 1 << 20) -> bytes | None:
    """Up to `limit` bytes of the log from `offset`; None where no regular file is (the host
    says so). An error reading it (no permission) is one line naming the log."""
    try:
        return host.read_from(path, offset, limit)
    except OSError as exc:
        raise MmmError(f"log {path}: cannot read it: {exc.strerror or exc}") from None


def tail(host: Host, path: str, lines: int, block: int = 1 << 16) -> tuple[bytes, int]:
    """The last `lines` lines of the file and the offset where they end, reading backwards in
    blocks (a remote log may be large)."""
    end = host.size(path) or 0
    data, start = b"", end
    while start > 0 and data.count(b"\n") <= lines:
        start = max(0, start - block)
        data = read(host, path, start, end - start) or b""
    kept = data.splitlines(keepends=True)[-lines:] if lines else []
    return b"".join(kept), end


def follow(
    host: Host,
    path: str,
    is_done: Callable[[], bool],
    start: int = 0,
    poll: float = 0.25,
    done_every: float = 2.0,
    on_wait: Callable[[], None] | None = None,
) -> Iterator[bytes]:
    """New bytes of `path` from `start` as they are written. Waits while the file does not exist;
    stops once `is_done()` (checked every `done_every` seconds) and everything was read."""
    offset = start
    last_check = 0.0
    waited = False
    while True:
        chunk = read(host, path, offset)
        if chunk:
            # Hold back a trailing partial line until it is complete (or the job ended).
            cut = chunk.rfind(b"\n") + 1
            if cut:
                offset += cut
                yield chunk[:cut]
                continue
        elif chunk is None and not waited and on_wait:
            on_wait()
            waited = True
        now = time.monotonic()
        if now - last_check >= done_every:
            last_check = now
            if is_done():
                while rest := read(host, path, offset):
                    offset += len(rest)
                    yield rest
                return
        time.sleep(poll)


def head_and_tail(host: Host, path: str, head: int = 8 << 20, last: int = 1 << 16) -> str | None:
    """The start and the end of a log (markers sit there), without reading all of a huge one;
    None where no log (no regular file) is."""
    first = read(host, path, 0, head)
    if first is None:
        return None
    size = host.size(path) or 0
    if size > head:
        first += b"\n" + (read(host, path, max(head, size - last), last) or b"")
    return first.decode("utf-8", errors="replace")


def write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
