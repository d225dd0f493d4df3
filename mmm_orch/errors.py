"""Errors the CLI reports as one line on stderr: exit code 2 (the user can fix it), 3 (a
scheduler could not be reached; try again)."""


class MmmError(Exception):
    """A usage, configuration or validation error: the user can fix it, nothing was done."""

    exit_code = 2

    def __str__(self) -> str:
        # One line, whatever the message quotes (a file's text, a scheduler's words): a line
        # break or other control character in it is shown escaped, as repr() would.
        return one_line(super().__str__())


def one_line(text: str) -> str:
    """`text` with its line breaks and other unprintable characters escaped."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


class InvalidValue(MmmError):
    """A value the user gave that is not allowed: which field, the value, and what is allowed
    (the message says all three)."""

    def __init__(self, field: str, value: object, allowed: str, message: str = ""):
        super().__init__(message or f"{field} {shown(value)} is invalid: {allowed}")
        self.field, self.value, self.allowed = field, value, allowed


class UnknownName(InvalidValue):
    """A machine, workload, option, preset or queue name that does not exist."""


class QueueFull(MmmError):
    """The queues that fit have no room for the jobs asked for: the facility's job limits
    (planning/occupancy.py)."""


class ConfigError(MmmError):
    """A machine profile, workload spec or template that cannot be used as written."""


class SchedulerError(MmmError):
    """The scheduler refused (bad partition, over a limit, ...): its own message, exit code 2."""


class SubmissionRefused(SchedulerError):
    """The scheduler's own refusal of a submission, or a submit command that is not there: the
    one proof that it has no job, so the only error after which a record may be removed."""


class OverLimit(SubmissionRefused):
    """Refused for a job-count limit (the user's or project's jobs in the queue): the job could
    go in once others end (a backlog's run waits again)."""


class SchedulerUnavailable(MmmError):
    """The scheduler could not be reached within the retry budget."""

    exit_code = 3


class Unreachable(SchedulerUnavailable):
    """The command never left this computer (no connection to the login node or the
    scheduler): nothing can have been submitted."""


class SubmissionUnconfirmed(SchedulerUnavailable):
    """The scheduler may have taken the job, and could not be asked whether it did before the
    retry budget ran out: the record stays `submitting` until `status` finds out."""


class PretrainedError(ValueError):
    """A checkpoint that cannot start this run: one line naming the file, the field or the
    tensor, what it holds and what was expected."""

    def __str__(self) -> str:
        # One line whatever the file says: its names and values are shown escaped.
        return one_line(super().__str__())


def shown(value: object) -> str:
    """A value as an error message shows it: its repr on one line, cut short past 200
    characters; a huge integer by its size (Python refuses to print one of over 4300 digits);
    the type's name where the repr itself fails (any object may be given to the Python API)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        digits = len(str(value)) if value.bit_length() < 14000 else "over 4000"
        return f"(an integer of {digits} digits)"
    try:
        text = one_line(repr(value))
    except Exception:  # noqa: BLE001 - a repr may raise anything
        return f"<{type(value).__name__} object>"
    return text if len(text) <= 200 else f"{text[:120]}... ({len(text)} characters)"
