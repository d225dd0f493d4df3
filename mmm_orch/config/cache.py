"""Validated profiles and specs, cached by content so that pydantic runs only on change.

An entry is used only when the mmm-orch version, the config model sources, the set of files on
the search path and the bytes of every file the object was built from are all unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import sys
import time
import types
import typing
from pathlib import Path
from typing import Any

from mmm_orch.paths import MAX_CONFIG_BYTES, NotReadable, cache_home, read_regular
from mmm_orch.schedulers import kind_names
from mmm_orch.version import __version__

# What decides a validated object: the models and the validation (a change to any of them
# makes every cached profile and spec stale).
_MODEL_SOURCES = (
    "common.py",
    "machine.py",
    "charging.py",
    "queues.py",
    "failures.py",
    "workload.py",
    "yamlio.py",
    "cache.py",
    "../options/run.py",  # the run options a spec takes (workload.with_run_options)
)


# An entry is a validated profile or spec as JSON: a few times the 1 MiB a source file may have.
MAX_ENTRY_BYTES = 8 * MAX_CONFIG_BYTES


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@functools.cache
def _models_digest() -> str:
    here = Path(__file__).parent
    parts = [__version__.encode()] + [(here / name).read_bytes() for name in _MODEL_SOURCES]
    parts.append(" ".join(kind_names()).encode())  # the kinds a profile's scheduler may be
    return _digest(b"\0".join(parts))


def _directory() -> Path:
    return cache_home() / "config"


def _entry_path(kind: str, path: Path) -> Path:
    return _directory() / f"{kind}-{_digest(str(path.resolve()).encode())[:20]}.json"


def _file_digest(path: Path) -> str | None:
    try:
        return _digest(read_regular(path, MAX_CONFIG_BYTES))
    except (OSError, NotReadable):
        return None  # not cached: loading it says why


# In this process: what was read, with its files' stat (a long-lived process, such as a script
# submitting hundreds of jobs through the Python API, re-reads only a file that changed). As git
# does, a file changed within RACY_S of now is read again: a second write in the same clock
# tick leaves the same stat.
_memo: dict[tuple[str, str, str], tuple[list[tuple[str, Any]], Any]] = {}
RACY_S = 2


def _stat(dep: str) -> Any:
    try:
        st = os.stat(dep)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _unchanged(stats: list[tuple[str, Any]]) -> bool:
    settled = time.time_ns() - RACY_S * 10**9
    return all(seen is not None and _stat(dep) == seen and seen[0] < settled for dep, seen in stats)


def get(kind: str, path: Path, cls: type, search_digest: str) -> Any | None:
    key = (kind, str(path), search_digest)
    if (hit := _memo.get(key)) is not None and _unchanged(hit[0]):
        return hit[1]
    try:
        entry = json.loads(read_regular(_entry_path(kind, path), MAX_ENTRY_BYTES))
    except (OSError, ValueError, RecursionError):  # NotReadable is a ValueError
        return None
    if not isinstance(entry, dict):
        return None
    if entry.get("models") != _models_digest() or entry.get("search") != search_digest:
        return None
    stats = [(dep, _stat(dep)) for dep, _ in entry.get("deps", [])]
    for dep, digest in entry.get("deps", []):
        if _file_digest(Path(dep)) != digest:
            return None
    obj = from_data(cls, entry["data"])
    _memo[key] = (stats, obj)
    return obj


def put(kind: str, path: Path, obj: Any, deps: list[Path], search_digest: str) -> None:
    entry = {
        "models": _models_digest(),
        "search": search_digest,
        "deps": [[str(dep), _file_digest(dep)] for dep in deps],
        "data": dataclasses.asdict(obj),
    }
    target = _entry_path(kind, path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp.write_text(json.dumps(entry), encoding="utf-8")
        tmp.replace(target)
    except OSError:  # only a cache: one read-only, full or blocked by a file costs speed
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def from_data(tp: Any, value: Any) -> Any:
    """Rebuild config dataclasses from data that already passed validation."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp(
            **{
                key: item if _scalars(item) else from_data(_field_type(tp, key), item)
                for key, item in value.items()
            }
        )
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return from_data(args[0], value)
    if origin is list:
        return [from_data(args[0], item) for item in value]
    if origin is dict:
        return {key: from_data(args[1], item) for key, item in value.items()}
    if origin in (typing.Union, types.UnionType) and isinstance(value, dict):
        return next(from_data(a, value) for a in args if dataclasses.is_dataclass(a))
    return value


def _scalars(value: Any) -> bool:
    """Whether `value` holds no mapping, which alone can be a dataclass: it is kept as it is."""
    if isinstance(value, list):
        return all(_scalars(item) for item in value)
    return not isinstance(value, dict)


@functools.cache
def _field_type(cls: type, name: str) -> Any:
    """The annotation of field `name` of `cls`, evaluated where the class is defined (the config
    modules' annotations are text). One field at a time, and only a field that holds a mapping:
    typing.get_type_hints evaluates every annotation and rebuilds each Annotated, Literal and
    Union in it without their metadata, ~3 ms of `mmm-orch render`'s start-up (2-core host,
    2026-11-26)."""
    owner = next(c for c in cls.__mro__ if name in vars(c).get("__annotations__", {}))
    annotation = owner.__annotations__[name]
    if isinstance(annotation, str):
        annotation = eval(annotation, vars(sys.modules[owner.__module__]))  # the source, not data
    return annotation
