"""Step metrics: one `key=value` line per step on rank 0 and a JSONL file per run.

The line format is stable so that logs can be parsed (mmm-orch timeline/startup, grep):
    step=12 loss=2.314159 dt=0.1234 dtf=0.0410 dtb=0.0790 tokens_per_s=16600.2 mfu=41.20 mem_gib=12.31
Throughput (`tokens_per_s`, `samples_per_s`) is per device, as torchtitan reports it: the job's is
that times the ranks; `mmm-orch report` compares sizes with it.
The first step a launch completes also prints a marker (injob/protocol.py) with the wall-clock
time, for startup analysis (`resumed_step` when the launch continues a run from its checkpoint):
    [mmm-orch] first_step=1732212345.123 step=1 at=2026-11-22 01:32:25
    [mmm-orch] resumed_step=1732215945.456 step=151 at=2026-11-22 02:32:25
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from mmm_orch.injob import protocol
from mmm_orch.injob.runfiles import kind, open_read, open_write, step_number
from mmm_orch.runtime.experiment_trackers import numbers, open_trackers

# A metric's name: one `key=value` field whatever it holds (TensorBoard-style `train/loss` too).
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")


def say(line: str) -> None:
    """Write one whole line at once, so lines from several ranks do not interleave mid-line."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _format(value: Any) -> str:
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:.1f}"
        return f"{value:.4f}" if abs(value) >= 1e-2 else f"{value:.4g}"
    text = str(value)
    if all(ch.isprintable() and not ch.isspace() for ch in text):
        return text
    # One field on its line: a line break in a value (a path, a message) would start a line of
    # its own in the job log, which could pass for a marker. Escaped as JSON escapes it.
    return json.dumps(text).replace(" ", "\\u0020")


def format_line(fields: dict[str, Any]) -> str:
    """`key=value ...`; ValueError for a key that is not a metric's name."""
    for key in fields:
        if not (isinstance(key, str) and _KEY.fullmatch(key)):
            raise ValueError(
                f"metric name {key!r}: expected a letter or _ then letters, digits and _ . / -"
            )
    return " ".join(f"{key}={_format(value)}" for key, value in fields.items() if value is not None)


def parse_line(line: str) -> dict[str, str]:
    """The fields of a metrics line (the inverse of format_line, values as text)."""
    return dict(part.split("=", 1) for part in line.split() if "=" in part)


def _drop_after(path: Path, step: int) -> None:
    """Forget the records of steps after the checkpoint a run resumes from: a launch that died
    past its last checkpoint ran them, and the resumed launch runs them again. The file then holds
    every step once, as the run that went on computed it. Lines are kept as bytes, unread: one
    that is not a record (cut short by the crash, not UTF-8) stays as it was for the reports to
    skip, and a resume never fails on it."""
    if kind(path) == "missing":
        return
    partial = path.with_suffix(".jsonl.partial")
    with open_read(path) as old, open_write(partial, "wb") as new:
        for line in old:
            if _step_of(line) <= step:
                new.write(line if line.endswith(b"\n") else line + b"\n")
    partial.replace(path)  # atomic: a crash here leaves the old file or the new one


def _step_of(line: bytes) -> int:
    """The step a step or checkpoint record is about; 0 for any other (or an unreadable) line.
    A record is a few hundred bytes: a longer line is not parsed."""
    if len(line) > 1 << 16:
        return 0
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return 0
    if (
        isinstance(record, dict)
        and record.get("event") in ("step", protocol.CHECKPOINT_EVENT)
        and type(record.get("step")) is int
    ):
        return record["step"]
    return 0


class MetricLogger:
    """Prints and records metrics on the main rank only; the other ranks' calls are no-ops."""

    def __init__(self, run_dir: Path, config: dict[str, Any], enabled: bool, resumed_from: int = 0):
        """`resumed_from`: the checkpoint's step when the launch continues a run (0: a fresh run)."""
        self.enabled = enabled
        self.resumed = resumed_from > 0
        self.announced = False  # the marker of this launch's first step is printed
        self._file = None
        if enabled:
            run_dir.mkdir(parents=True, exist_ok=True)
            path = run_dir / protocol.METRICS_FILE
            if self.resumed:
                _drop_after(path, resumed_from)
            self._file = open_write(path, "a" if self.resumed else "w", encoding="utf-8")
            self._write({"event": "config", "time": time.time(), "config": config})
        # Main rank only; each tracker imports its package only when the run asks for it.
        self._trackers = open_trackers(run_dir, config, resumed_from) if enabled else []

    def _write(self, record: dict[str, Any]) -> None:
        assert self._file is not None
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def step(self, step: int, **fields: Any) -> None:
        """ValueError for a step that is no int >= 0 or a field named as no metric is, on every
        rank alike."""
        step = step_number(step)  # it is in the marker line, and each record's key
        line = format_line({"step": step, **fields})
        if not self.enabled:
            return
        now = time.time()
        if not self.announced:
            self.announced = True
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
            marker = protocol.RESUMED_STEP if self.resumed else protocol.FIRST_STEP
            say(f"{marker}{now:.3f} step={step} at={stamp}")
        say(line)
        self._write({"event": "step", "time": now, "step": step, **fields})
        for tracker in self._trackers:
            tracker.log(step, numbers(fields))

    def event(self, name: str, **fields: Any) -> None:
        """A non-step record (epoch summary, checkpoint, ...), also printed as a line."""
        if not self.enabled:
            return
        say(f"[{name}] " + format_line(fields))
        self._write({"event": name, "time": time.time(), **fields})

    def close(self) -> None:
        for tracker in self._trackers:
            tracker.close()
        self._trackers = []
        if self._file is not None:
            self._file.close()
            self._file = None
