"""What a table of the job database needs of it (bad_nodes.py, groups.py): its connection, a
write transaction, and SQLite's errors said in the database's words. JobDB gives all three."""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from typing import Protocol


class Access(Protocol):
    conn: sqlite3.Connection

    def write(self) -> AbstractContextManager[sqlite3.Connection]: ...

    def errors(self, doing: str) -> AbstractContextManager[None]: ...
