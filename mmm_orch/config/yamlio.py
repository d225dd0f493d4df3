"""Load a YAML file into plain data plus a map from key paths to line numbers,
so that validation errors can name the file, the line and the key."""

from __future__ import annotations

import dataclasses
import functools
import sys
import typing
from pathlib import Path
from typing import Any

import yaml

from mmm_orch.config.common import first_line_break
from mmm_orch.errors import ConfigError, shown
from mmm_orch.paths import MAX_CONFIG_BYTES, NotReadable, read_regular

_Loader: type[yaml.CSafeLoader] | type[yaml.SafeLoader]
try:  # libyaml is several times faster when present
    _Loader = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on the PyYAML build
    _Loader = yaml.SafeLoader

Path_ = tuple[Any, ...]
MAX_DEPTH = 64
MAX_NODES = 100_000
_INT_TAG = "tag:yaml.org,2002:int"


class YamlDoc(typing.NamedTuple):
    path: Path
    data: Any
    lines: dict[Path_, int]

    def line_of(self, loc: Path_) -> int | None:
        """Line of the deepest key on `loc` that the file has."""
        for end in range(len(loc), -1, -1):
            if loc[:end] in self.lines:
                return self.lines[loc[:end]]
        return None

    def where(self, loc: Path_) -> str:
        line = self.line_of(loc)
        return f"{self.path}:{line}" if line else str(self.path)


def _index(node: yaml.Node, loc: Path_, lines: dict[Path_, int], path: Path) -> None:
    lines.setdefault(loc, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                raise ConfigError(
                    f"{path}:{key_node.start_mark.line + 1}: duplicate key {format_loc(loc + (key,))!r}"
                )
            seen.add(key)
            lines[loc + (key,)] = key_node.start_mark.line + 1
            _index(value_node, loc + (key,), lines, path)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index(item, loc + (i,), lines, path)
    elif node.tag == _INT_TAG and len(node.value) > sys.get_int_max_str_digits():
        # int() refuses it with a ValueError that names nothing: refused here by its place.
        raise ConfigError(
            f"{path}:{node.start_mark.line + 1}: {format_loc(loc)} (an integer of "
            f"{len(node.value)} digits) is invalid: no value is that large"
        )


def _check_nesting(text: str, path: Path) -> None:
    """Refuse a document nested deeper than MAX_DEPTH before it is composed: the composer
    recurses per level (in C with libyaml), and 100,000 nested brackets crash the interpreter.
    Reading events is iterative."""
    depth = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                where = f"{path}:{event.start_mark.line + 1}" if event.start_mark else str(path)
                raise ConfigError(
                    f"{where}: nested deeper than {MAX_DEPTH} levels; a profile "
                    "or spec needs a handful"
                )
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def _check_expansion(node: yaml.Node, path: Path) -> None:
    """Refuse aliases that expand past MAX_NODES nodes ("billion laughs"): a composed document
    shares an anchored node, but walking it (the line index, pydantic) visits every use."""
    sizes: dict[int, int] = {}

    def size(item: yaml.Node) -> int:
        if id(item) not in sizes:
            children = (
                item.value
                if isinstance(item, yaml.SequenceNode)
                else [n for pair in item.value for n in pair]
                if isinstance(item, yaml.MappingNode)
                else []
            )
            sizes[id(item)] = min(1 + sum(size(child) for child in children), MAX_NODES + 1)
        return sizes[id(item)]

    if size(node) > MAX_NODES:
        raise ConfigError(
            f"{path}: its aliases expand to more than {MAX_NODES} values; a profile "
            "or spec needs a few hundred"
        )


def load_yaml(path: Path) -> YamlDoc:
    try:
        text = read_regular(path, MAX_CONFIG_BYTES).decode("utf-8")
    except NotReadable as exc:
        raise ConfigError(str(exc)) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {exc.start}: {exc.object[exc.start : exc.start + 1]!r})"
        ) from None
    loader = _Loader(text)
    try:
        _check_nesting(text, path)
        node = loader.get_single_node()
        if node is None:
            raise ConfigError(f"{path}: the file is empty")
        _check_expansion(node, path)
        lines: dict[Path_, int] = {}
        _index(node, (), lines, path)
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{line}: YAML error: {exc.problem or exc.context}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: YAML error: {exc}") from exc
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise ConfigError(f"{path}:1: expected a mapping of keys at the top level")
    return YamlDoc(path, data, lines)


def format_loc(loc: Path_) -> str:
    """`presets[0].set.NAME`; a key with a line break or other control character is shown as
    [repr]: an error is one line whatever the file's keys hold."""
    out = ""
    for part in loc:
        if isinstance(part, int) or not str(part).isprintable():
            out += f"[{part!r}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _field_type(cls: Any, loc: Path_) -> Any:
    """The dataclass found by walking `loc` through field annotations (best effort)."""
    current = cls
    for part in loc:
        if dataclasses.is_dataclass(current):
            hints = typing.get_type_hints(current)
            if part not in hints:
                return None
            current = hints[part]
            continue
        args = [a for a in typing.get_args(current) if a is not type(None)]
        origin = typing.get_origin(current)
        if origin in (list, tuple) and isinstance(part, int) and args:
            current = args[0]
        elif origin is dict and len(args) == 2:
            current = args[1]
        else:  # Optional / Union: the first dataclass member
            members = [a for a in args if dataclasses.is_dataclass(a)]
            if not members:
                return None
            current = _field_type(members[0], (part,))
    return current


@functools.cache
def adapter(cls: type) -> Any:
    # pydantic costs ~23 ms to import (2-core host, 2026-11-26) and more to build validators:
    # only validation needs it, not load_yaml (records/usage.py reads YAML without it).
    from pydantic import TypeAdapter

    return TypeAdapter(cls)


def validate(cls: type, doc: YamlDoc, data: Any = None) -> Any:
    """Validate `data` (default: the document) as `cls`; one clear error on failure."""
    from pydantic import ValidationError  # see adapter()

    try:
        obj = adapter(cls).validate_python(doc.data if data is None else data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err["loc"])
        if err["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
            parent = _field_type(cls, loc[:-1])
            allowed = ""
            if dataclasses.is_dataclass(parent):
                allowed = f" (allowed: {', '.join(f.name for f in dataclasses.fields(parent))})"
            msg = f"unknown key {format_loc(loc)!r}{allowed}"
        else:
            value = err.get("input")
            got = "" if isinstance(value, (dict, list)) else f" (got {shown(value)})"
            msg = f"{format_loc(loc) or 'document'}: {err['msg']}{got}"
        more = f" [+{exc.error_count() - 1} more]" if exc.error_count() > 1 else ""
        raise ConfigError(f"{doc.where(loc)}: {msg}{more}") from None
    broken = first_line_break(obj)
    if broken:
        loc, text = broken
        raise ConfigError(
            f"{doc.where(loc)}: {format_loc(loc)}: a line break is not allowed "
            f"here (got {text!r}); only the shell lines (setup, "
            "scheduler.node_list, rendezvous.master_addr/master_port) may hold one"
        )
    return obj
