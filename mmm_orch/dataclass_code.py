"""dataclasses.dataclass, with the code it generates compiled once instead of in every process.

dataclasses writes a class's __init__, __repr__, __eq__, __hash__ (and, frozen, __setattr__ and
__delattr__) as Python source and compiles it each time the class is made: at every start of
every command. Compiling was ~80% of making a class (planning/model.py's 17 classes: 8 of 10
ms), and the table below saves ~29 ms of `mmm-orch render`'s ~175 ms (median wall time, a 2-core
host, 2026-11-26).

While `dataclass` below runs, dataclasses' own module namespace holds an `exec` that looks the
generated source up in a table before compiling it (dataclasses hands each method's text to
exec, and a module's global comes before the builtin of that name); nothing else is touched,
so every class is made exactly as dataclasses makes it. The table is kept in the cache directory,
one file per Python build (the bytecode and marshal's format are per build), keyed by the source
text: the same text always compiles to the same code, so an entry is never stale, and a class
that changed is compiled and added. A table that cannot be read costs the compiling, nothing
else; like Jinja's bytecode cache beside it, it is code, trusted as the user's own cache is (and
like it, written whatever PYTHONDONTWRITEBYTECODE says, which is about .pyc files).
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import dataclasses
import marshal
import os
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmm_orch.paths import NotReadable, cache_home, read_regular

MAX_BYTES = 16 << 20  # the table of every class made through here is ~0.4 MiB
MAX_ENTRIES = 4000  # past this (many versions of the classes), only what this process used is kept

_lock = threading.RLock()
_table: dict[str, types.CodeType] | None = None  # loaded on first use
_used: set[str] = set()
_added = 0  # entries compiled by this process: the table is saved at exit when there are any
_file: Path | None = None
# exec compiles a text with the __future__ features of the module calling it: dataclasses'.
_FLAGS: int = getattr(vars(dataclasses).get("annotations"), "compiler_flag", 0)


if TYPE_CHECKING:  # to a type checker it is dataclasses' own
    from dataclasses import dataclass as dataclass
else:

    def dataclass(cls=None, /, **options):
        """`dataclasses.dataclass(cls, **options)`; the code of its methods compiled once."""

        def make(cls):
            with _compiled_once():
                return dataclasses.dataclass(cls, **options)

        return make if cls is None else make(cls)


@contextlib.contextmanager
def _compiled_once() -> Iterator[None]:
    global _table, _file
    namespace = vars(dataclasses)
    with _lock:
        if _table is None:
            _file = _path()
            _table = _load(_file) if _file else {}
            atexit.register(_save)
        before = namespace.get("exec")
        namespace["exec"] = _exec
        try:
            yield
        finally:
            if before is None:
                del namespace["exec"]
            else:
                namespace["exec"] = before


def _exec(
    source: Any, globals: dict[str, Any] | None = None, locals: dict[str, Any] | None = None, /
) -> None:
    """exec, as dataclasses calls it, with the code of `source` from the table."""
    global _added
    if not isinstance(source, str) or _table is None:
        return builtins.exec(source, globals, locals)
    code = _table.get(source)
    if not isinstance(code, types.CodeType):
        code = _table[source] = compile(source, "<string>", "exec", _FLAGS, dont_inherit=True)
        _added += 1
    _used.add(source)
    return builtins.exec(code, globals, locals)


def _path() -> Path | None:
    tag = sys.implementation.cache_tag
    return cache_home() / f"dataclasses-{tag}-{sys.hexversion:x}.marshal" if tag else None


def _load(path: Path) -> dict[str, types.CodeType]:
    try:
        table = marshal.loads(read_regular(path, MAX_BYTES))
    except (OSError, NotReadable, EOFError, ValueError, TypeError):  # none yet, or damaged
        return {}
    return table if isinstance(table, dict) else {}


def _save() -> None:
    """At exit, when this process compiled something: the table, for the next process."""
    if not _added or _table is None or _file is None:
        return
    table = _table if len(_table) <= MAX_ENTRIES else {s: _table[s] for s in _used}
    tmp = _file.with_name(f".{_file.name}.{os.getpid()}.tmp")
    try:
        _file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp.write_bytes(marshal.dumps(table))
        tmp.replace(_file)
    except (OSError, ValueError):  # only a cache: a read-only or full disk costs the compiling
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
