"""How a job ended, read from what it left (its outcome, screen and failover files, and its log),
as injob/ends.py classes it: once, when a refresh first sees the job ended, and again by
`diagnose`, which reads the whole log."""

from __future__ import annotations

import posixpath
from typing import Any

from mmm_orch.errors import MmmError
from mmm_orch.hosts import Host
from mmm_orch.injob import ends, files, protocol
from mmm_orch.injob.diagnose import diagnose
from mmm_orch.progress.logs import head_and_tail
from mmm_orch.progress.startup import parse_markers
from mmm_orch.records.record import JobRecord
from mmm_orch.schedulers.states import JobState


class Signatures:
    """Each machine's failure signatures, read once a refresh and only where a job ended."""

    def __init__(self) -> None:
        self._by_machine: dict[str, list] = {}

    def of(self, machine: str) -> list:
        if machine not in self._by_machine:
            from mmm_orch.config.failures import common_failures, machine_failures

            try:
                self._by_machine[machine] = machine_failures(machine)
            except MmmError:  # a profile gone or broken since: the common ones still tell
                self._by_machine[machine] = common_failures()
        return self._by_machine[machine]


# What an ended job's end class is read from in its log: the markers at its start and the
# failure lines, mostly at its end (a huge log is not read whole on every refresh).
END_LOG_HEAD = 1 << 20
END_LOG_TAIL = 4 << 20


def end_of(
    record: JobRecord,
    state: JobState,
    reason: str,
    host: Host,
    signatures: list,
    log: str | None = None,
    diagnosis: Any = None,
) -> ends.End:
    """The end class of a job that has ended (injob/ends.py), from its files: its outcome, its
    screen, its failover and its log (`log`, else its start and end read here). `diagnosis`:
    the log's (injob.diagnose.Diagnosis) where the caller has already made it from `log`."""
    text = (
        log
        if log is not None
        else head_and_tail(host, record.log_path, head=END_LOG_HEAD, last=END_LOG_TAIL) or ""
    )
    outcome = _readable(host, record, protocol.OUTCOME_FILE, files.Outcome)
    screen = _readable(host, record, protocol.SCREEN_FILE, files.ScreenResult)
    failover = _readable(host, record, protocol.FAILOVER_FILE, files.FailoverState)
    stepped = parse_markers(text).first_step is not None or (
        outcome is not None and outcome.last_step is not None
    )
    return ends.classify(
        ends.Facts(
            state=state.value,
            reason=reason,
            why=outcome.why if outcome else "",
            first_step=stepped,
            setup_failed=m.group(0) if (m := protocol.SETUP_FAILURE.search(text)) else "",
            finding=(diagnosis or diagnose(text, signatures)).first,
            screened_out=screen.left_out if screen else (),
            retired=failover.retired if failover else (),
        )
    )


def _readable(host: Host, record: JobRecord, name: str, kind: type) -> Any:
    """The job's file `name` read as `kind` (a files.* schema); None where there is none, or it
    is not as the job writes it (said elsewhere in the status)."""
    try:
        text = host.read_from(posixpath.join(record.job_dir, name), 0)
    except (MmmError, OSError):
        return None
    if not text:
        return None
    try:
        return kind.from_json(text)  # type: ignore[attr-defined]
    except files.ProtocolFileError:
        return None
