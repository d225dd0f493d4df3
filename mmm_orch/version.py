"""The version of mmm-orch (one place; the package re-exports it)."""

__version__ = "0.1.0"
