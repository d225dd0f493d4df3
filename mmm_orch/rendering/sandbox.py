"""Templates are data: a sandboxed Jinja environment, bounded in time, size and output.

A template may come from anyone: `--template FILE`, a directory on `$MMM_ORCH_PATH`, or
`./.mmm-orch/templates` in whatever checkout the user stands in. `render` and `--dry-run` exist for
review, so rendering must never run code or exhaust the machine:

- Jinja's immutable sandbox: no attributes starting with `_`, no function objects' internals, no
  mutation of lists and dicts, `str.format` checked (so no way from `plan` to Python's `os`);
  `namespace` removed (it is the one way to carry a growing value across loop iterations).
- Time: every loop iteration, call, filter, concatenation and intercepted operator checks the
  CPU time the render has used (RENDER_SECONDS). CPU time, not wall time: a render cannot wait
  on anything, so only spinning uses it up, and a render starved of the CPU on a loaded host
  (a job submitted at `nice 19`) is not cut short.
- Size: every string or sequence a call, filter, operator or `~` makes is at most MAX_VALUE long,
  and integer arguments (widths, counts, exponents) at most MAX_COUNT, checked before the work;
  the output stops at MAX_OUTPUT. A job script is a few kilobytes.
- Files: only regular files of at most MAX_TEMPLATE bytes are read (a FIFO would block forever).
"""

from __future__ import annotations

import os
import re
import shlex
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
from jinja2.visitor import NodeTransformer

from mmm_orch.paths import NotReadable, read_regular

RENDER_SECONDS = 5.0
MAX_OUTPUT = 1 << 20
MAX_VALUE = 1 << 20
MAX_COUNT = jinja2.sandbox.MAX_RANGE
MAX_TEMPLATE = 256 << 10
# A width or precision of a million or more, written in a format string ('%0999999d', '{:>999999}'),
# or taken from the values ('%*d', '{:{}}').
_WIDE_FORMAT = re.compile(r"%[-+ #0]*(\d*\.)?\d{6}|\{[^{}]*:[^{}]*\d{6}")
_WIDTH_FROM_VALUES = re.compile(r"%[-+ #0]*(\d*\.)?\*|\{[^{}]*:[^{}]*\{")


class TemplateLimit(SecurityError):
    """A template went past a bound on time or size."""


class _Deadline(threading.local):
    """The end of the render in progress in this thread (a render never nests), in the thread's
    CPU time."""

    end = float("inf")

    def check(self) -> None:
        if time.thread_time() > self.end:
            raise TemplateLimit(f"rendering took longer than {RENDER_SECONDS:g} s")


def _size(value: Any) -> int:
    return len(value) if isinstance(value, (str, bytes, list, tuple, dict, set, frozenset)) else 0


def _check_value(value: Any, what: str) -> Any:
    if _size(value) > MAX_VALUE:
        raise TemplateLimit(f"{what} made a value of {_size(value)} items (at most {MAX_VALUE})")
    return value


def _check_arguments(args: Iterable[Any], what: str, counts: bool = True) -> None:
    """Sizes of every argument; with `counts`, integers too (widths, repeats, lengths)."""
    for arg in args:
        if counts and isinstance(arg, int) and not isinstance(arg, bool) and abs(arg) > MAX_COUNT:
            raise TemplateLimit(f"{what}: argument {arg} is above {MAX_COUNT}")
        _check_value(arg, what)


def _check_format(text: Any, values: Iterable[Any], what: str) -> None:
    """A format string and what it formats: the numbers formatted may be any size, unless the
    string takes a width from them."""
    values = list(values)
    if isinstance(text, str):
        if _WIDE_FORMAT.search(text):
            raise TemplateLimit(f"{what}: a format width of a million or more")
        _check_arguments(values, what, counts=bool(_WIDTH_FROM_VALUES.search(text)))


class SandboxLoader(jinja2.BaseLoader):
    """Templates from directories, first match wins, regular files only, bounded in size."""

    def __init__(self, directories: tuple[str, ...]) -> None:
        self.directories = directories

    def get_source(self, environment: jinja2.Environment, template: str):
        pieces = jinja2.loaders.split_template_path(template)  # refuses `..`
        for directory in self.directories:
            path = os.path.join(directory, *pieces)
            try:
                mtime = os.stat(path).st_mtime_ns
            except OSError:
                continue
            return read_template(path), path, _unchanged(path, mtime)
        raise jinja2.TemplateNotFound(template)


def _unchanged(path: str, mtime_ns: int):
    def uptodate() -> bool:
        try:
            return os.stat(path).st_mtime_ns == mtime_ns
        except OSError:
            return False

    return uptodate


def read_template(path: str) -> str:
    """A template's text; one that is not a regular file or is too large is refused unread."""
    try:
        return read_regular(path, MAX_TEMPLATE).decode("utf-8")
    except NotReadable as exc:
        raise TemplateLimit(str(exc)) from None


class Sandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "+", "%", "//"})

    def __init__(self, directories: tuple[str, ...], **options: Any) -> None:
        super().__init__(
            loader=SandboxLoader(directories),
            undefined=jinja2.StrictUndefined,
            autoescape=False,
            **options,
        )
        self.deadline = _Deadline()
        self._safe: dict[tuple[type, str], bool] = {}
        self.globals.pop("namespace", None)
        self.globals["range"] = self._range
        self.globals["_mmm_bounded_iter"] = self._bounded_iter
        self.globals["_mmm_concat"] = self._concat
        self.filters["sh"] = lambda value: shlex.quote(str(value))
        self.filters = {name: self._guarded_filter(name, f) for name, f in self.filters.items()}

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        """Jinja's answer depends on the object's type and the name only: asked once for each
        (a job script reads about 150 attributes of the plan)."""
        key = (type(obj), attr)
        safe = self._safe.get(key)
        if safe is None:
            if len(self._safe) > 4096:  # the names a template can spell bound it; be sure anyway
                self._safe.clear()
            safe = self._safe[key] = super().is_safe_attribute(obj, attr, value)
        return safe

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        return _Bounded().visit(super()._parse(source, name, filename))

    def _bounded_iter(self, iterable: Any) -> Iterator[Any]:
        if isinstance(iterable, jinja2.Undefined):
            iterable._fail_with_undefined_error()
        for item in iterable:
            self.deadline.check()
            yield item

    def _range(self, *args: int) -> Iterator[int]:
        return self._bounded_iter(jinja2.sandbox.safe_range(*args))  # at most MAX_RANGE items

    def _concat(self, *parts: Any) -> str:
        self.deadline.check()
        texts = [str(part) for part in parts]
        if sum(map(len, texts)) > MAX_VALUE:
            raise TemplateLimit(f"'~' made a string above {MAX_VALUE} characters")
        return "".join(texts)

    def _guarded_filter(self, name: str, function: Any) -> Any:
        passed = 1 if hasattr(function, "jinja_pass_arg") else 0  # a context comes first

        def guarded(*args: Any, **kwargs: Any) -> Any:
            self.deadline.check()
            if name == "format" and len(args) > passed:
                _check_format(
                    args[passed], [*args[passed + 1 :], *kwargs.values()], "filter format"
                )
            else:
                _check_arguments([*args[passed + 1 :], *kwargs.values()], f"filter {name}")
            if name == "replace" and len(args) >= passed + 3:
                _check_replace(*args[passed : passed + 3])
            return _check_value(function(*args, **kwargs), f"filter {name}")

        if passed:
            guarded.jinja_pass_arg = function.jinja_pass_arg  # type: ignore[attr-defined]
        return guarded

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        __self.deadline.check()
        name = (
            "range" if __obj == __self._range else getattr(__obj, "__name__", type(__obj).__name__)
        )
        what = f"call of {name}"
        # A bound method's own object: the format string of str.format (which the sandbox wraps).
        owner = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)
        if name in ("format", "format_map") and isinstance(owner, str):
            _check_format(owner, [*args, *kwargs.values()], what)
        else:
            _check_arguments([*args, *kwargs.values(), owner], what)
        if name == "replace" and len(args) >= 2:
            _check_replace(owner, args[0], args[1])
        return _check_value(super().call(__context, __obj, *args, **kwargs), what)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        self.deadline.check()
        what = f"operator {operator}"
        if operator == "**":
            if isinstance(right, int) and abs(right) > MAX_COUNT:
                raise TemplateLimit(f"{what}: exponent {right} is above {MAX_COUNT}")
            if (
                isinstance(left, int)
                and isinstance(right, int)
                and right > 0
                and left.bit_length() * right > 8 * MAX_VALUE
            ):
                raise TemplateLimit(f"{what}: a number of more than {8 * MAX_VALUE} bits")
        if operator == "*":
            for count, other in ((left, right), (right, left)):
                if isinstance(count, int) and _size(other) * max(count, 0) > MAX_VALUE:
                    raise TemplateLimit(f"{what} made a value above {MAX_VALUE} items")
        if operator == "%":
            _check_format(left, right if isinstance(right, (tuple, list)) else [right], what)
        if operator == "+" and _size(left) + _size(right) > MAX_VALUE:
            raise TemplateLimit(f"{what} made a value above {MAX_VALUE} items")
        return _check_value(super().call_binop(context, operator, left, right), what)

    def render_bounded(self, template: jinja2.Template, **context: Any) -> str:
        """The template's output, or TemplateLimit past the deadline or MAX_OUTPUT."""
        self.deadline.end = time.thread_time() + RENDER_SECONDS
        try:
            out: list[str] = []
            size = 0
            for chunk in template.generate(**context):
                size += len(chunk)
                if size > MAX_OUTPUT:
                    raise TemplateLimit(f"the output passed {MAX_OUTPUT} characters")
                self.deadline.check()
                out.append(chunk)
            return "".join(out)
        finally:
            self.deadline.end = float("inf")


class _Bounded(NodeTransformer):
    """Rewrites a parsed template before it is compiled: every for loop iterates through
    _bounded_iter and every `~` goes through _concat, where the deadline and sizes are checked."""

    def visit_For(self, node: nodes.For) -> nodes.For:
        self.generic_visit(node)
        node.iter = nodes.Call(
            nodes.Name("_mmm_bounded_iter", "load"), [node.iter], [], None, None, lineno=node.lineno
        )
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Call:
        self.generic_visit(node)
        return nodes.Call(
            nodes.Name("_mmm_concat", "load"), node.nodes, [], None, None, lineno=node.lineno
        )


def _check_replace(text: Any, old: Any, new: Any) -> None:
    if isinstance(text, str) and isinstance(old, str) and isinstance(new, str):
        grows = (text.count(old) if old else len(text) + 1) * max(len(new) - len(old), 0)
        if len(text) + grows > MAX_VALUE:
            raise TemplateLimit(f"replace() would make a string above {MAX_VALUE} characters")
