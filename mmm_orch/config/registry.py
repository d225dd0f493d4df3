"""Find, load and validate machine profiles and workload specs along the search path."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mmm_orch.config import cache
from mmm_orch.config.machine import Machine
from mmm_orch.config.workload import Workload, with_run_options
from mmm_orch.errors import ConfigError, UnknownName
from mmm_orch.paths import search_dirs


def _files(kind: str) -> dict[str, Path]:
    """name -> file, the highest-priority directory winning."""
    found: dict[str, Path] = {}
    for directory in search_dirs(kind):
        for path in sorted(directory.glob("*.yaml")):
            found.setdefault(path.stem, path)
    return found


def names(kind: str) -> list[str]:
    return sorted(_files(kind))


def unknown_name(what: str, name: str, choices: list[str]) -> UnknownName:
    import difflib  # ~1 ms of every start-up (2-core host, 2026-11-26), for a mistyped name only

    close = difflib.get_close_matches(name, choices, n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return UnknownName(
        what,
        name,
        f"one of {', '.join(choices)}",
        f"unknown {what} {name!r}{hint} (known: {', '.join(choices)})",
    )


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _packaged_file(kind: str, name: str) -> Path | None:
    path = search_dirs(kind)[-1] / f"{name}.yaml"
    return path if path.is_file() else None


def _resolve_extends(
    kind: str, path: Path, files: dict[str, Path], depth: int = 0
) -> tuple[Any, dict[str, Any], list[Path]]:
    """(document, data, files read). A user file with `extends: NAME` is deep-merged over NAME
    (lists are replaced)."""
    # Only on a cache miss: yamlio and PyYAML cost ~12 ms of a start-up (2-core host, 2026-11-26).
    from mmm_orch.config.yamlio import load_yaml

    doc = load_yaml(path)
    parent = doc.data.get("extends")
    if parent is None or parent == "":
        return doc, doc.data, [path]
    if not isinstance(parent, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", parent):
        raise ConfigError(
            f"{doc.where(('extends',))}: extends {parent!r} is invalid: the name "
            f"of one {kind[:-1]}, as `mmm-orch {kind}` lists them"
        )
    if depth > 4:
        raise ConfigError(f"{doc.where(('extends',))}: extends chain is too deep")
    base_path = files.get(parent)
    if base_path == path:  # a user file extending the packaged one of the same name
        base_path = _packaged_file(kind, parent)
    if base_path is None:
        raise ConfigError(f"{doc.where(('extends',))}: extends unknown {kind[:-1]} {parent!r}")
    _, base, deps = _resolve_extends(kind, base_path, files, depth + 1)
    merged = _deep_merge(base, doc.data)
    merged.pop("extends", None)
    # A machine's software is `stacks:` or the older `setup:`: the file's own form replaces the
    # other form it extends (both in one file stay an error).
    for own, other in (("setup", "stacks"), ("stacks", "setup")):
        if own in doc.data and other not in doc.data:
            merged.pop(other, None)
    merged["name"] = doc.data.get("name", path.stem)
    return doc, merged, [path, *deps]


def load(kind: str, name: str, cls: type, prepare: Callable[[Any], Any] | None = None) -> Any:
    """The validated profile or spec `name`; `prepare`: what the data read (its `extends`
    merged) becomes before it is validated."""
    files = _files(kind)
    if name not in files:
        raise unknown_name(kind[:-1], name, sorted(files))
    path = files[name]
    search = hashlib.sha256("\n".join(map(str, files.values())).encode()).hexdigest()
    obj = cache.get(kind, path, cls, search)
    if obj is not None:
        return obj
    from mmm_orch.config.yamlio import validate  # a cache miss only, as in _resolve_extends

    doc, data, deps = _resolve_extends(kind, path, files)
    obj = validate(cls, doc, prepare(data) if prepare else data)
    if obj.name != name:
        raise ConfigError(
            f"{doc.where(('name',))}: name {obj.name!r} differs from the file name {name!r}"
        )
    cache.put(kind, path, obj, deps, search)
    return obj


def load_machine(name: str) -> Machine:
    return load("machines", name, Machine)


def load_workload(name: str) -> Workload:
    return load("workloads", name, Workload, with_run_options)
