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
        super().__init__(message or f"{field} {value!r} is invalid: {allowed}")
        self.field, self.value, self.allowed = field, value, allowed


class UnknownName(InvalidValue):
    """A machine, workload, option, preset or queue name that does not exist."""


class ConfigError(MmmError):
    """A machine profile, workload spec or template that cannot be used as written."""


class SchedulerError(MmmError):
    """The scheduler refused (bad partition, over a limit, ...): its own message, exit code 2."""


class SubmissionRefused(SchedulerError):
    """The scheduler's own refusal of a submission, or a submit command that is not there: the
    one proof that it has no job, so the only error after which a record may be removed."""


class SchedulerUnavailable(MmmError):
    """The scheduler could not be reached within the retry budget."""

    exit_code = 3


class Unreachable(SchedulerUnavailable):
    """The command never left this computer (no connection to the login node or the
    scheduler): nothing can have been submitted."""


class SubmissionUnconfirmed(SchedulerUnavailable):
    """The scheduler may have taken the job, and could not be asked whether it did before the
    retry budget ran out: the record stays `submitting` until `status` finds out."""
