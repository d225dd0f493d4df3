"""Errors the CLI reports as one line on stderr with exit code 2."""


class MmmError(Exception):
    """A usage, configuration or validation error: the user can fix it, nothing was done."""

    exit_code = 2


class ConfigError(MmmError):
    """A machine profile, workload spec or template that cannot be used as written."""
