"""Walltimes: parsed from [D-]HH:MM:SS or HH:MM, kept as seconds, written as HH:MM:SS."""

from __future__ import annotations

import re

_WALLTIME = re.compile(r"^(?:(\d+)-)?(\d{1,3}):([0-5]\d)(?::([0-5]\d))?$")


def parse_walltime(text: str) -> int:
    """Seconds in `text`; raises ValueError with the accepted forms."""
    match = _WALLTIME.match(str(text).strip())
    if not match:
        raise ValueError(f"walltime {text!r} is malformed: use HH:MM:SS, HH:MM or D-HH:MM:SS")
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total <= 0:
        raise ValueError(f"walltime {text!r} must be longer than zero")
    return total


def format_walltime(seconds: int) -> str:
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"


def duration(text: object) -> float | None:
    """Seconds of a time a scheduler accounted (`01:02:03`, `1-00:00:00`, `00:00:00`), or None
    where it is not one."""
    match = _WALLTIME.match(str(text).strip())
    if not match:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)
