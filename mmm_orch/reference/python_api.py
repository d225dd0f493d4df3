"""The Python API's reference (docs/reference/python.md): `import mmm_orch` for jobs, and
`mmm_orch.runtime` for the program a job runs, each name with its signature and docstring."""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable
from types import ModuleType
from typing import Any

from mmm_orch.config.notes import comments
from mmm_orch.reference import header

INTRO = """
Jobs from a script or a notebook: `import mmm_orch` (the calls of the commands; see [commands
and the Python API](commands.md#from-python)). Inside the program a job runs: `from mmm_orch
import runtime` (the contract of [your own code](../runtime.md)). Errors are on the
[exit codes and errors](exit-codes.md) page.
"""


def markdown() -> str:
    from mmm_orch import api, runtime

    parts = [
        header(
            "Python API", "the docstrings and signatures of mmm_orch and mmm_orch.runtime", INTRO
        ),
        "## `mmm_orch`",
        "",
        _text(api.__doc__),
        "",
    ]
    parts += [_entry(getattr(api, name), f"mmm_orch.{name}") for name in api.__all__]
    parts.append(_keywords(api.KEYWORD_KINDS))
    parts += ["## `mmm_orch.runtime`", "", _text(runtime.contract.__doc__), ""]
    parts += [
        _entry(
            getattr(runtime, name), f"mmm_orch.runtime.{name}", _constant(runtime.contract, name)
        )
        for name in runtime.__all__
    ]
    return "\n".join(parts).rstrip() + "\n"


def _entry(obj: Any, name: str, said: str = "") -> str:
    if isinstance(obj, int):  # a constant: the comment beside its definition says what it is
        return f"### `{name} = {obj}`\n\n{said}\n"
    if inspect.isclass(obj):
        return _class(obj, name, said)
    return f"### `{name}`\n\n{_code(name, obj)}\n\n{_text(obj.__doc__)}\n"


def _class(cls: type, name: str, said: str) -> str:
    doc = "" if (cls.__doc__ or "").startswith(f"{cls.__name__}(") else cls.__doc__  # made up
    lines = [f"### class `{name}`", "", said or _text(doc), ""]
    if dataclasses.is_dataclass(cls):
        notes = comments(cls)
        lines += ["| field | type | default | |", "|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            default = "" if f.default is dataclasses.MISSING else f"`{f.default!r}`"
            if f.default_factory is not dataclasses.MISSING:
                default = f"`{f.default_factory()!r}`"
            kind = _type(f.type).replace("|", "\\|")
            lines.append(f"| `{f.name}` | `{kind}` | {default} | {notes.get(f.name, '')} |")
        return "\n".join([*lines, ""])  # data: its fields are what it offers
    shown = [(n, m) for n, m in vars(cls).items() if not n.startswith("_")]
    fields = [n for n, m in shown if isinstance(m, property) and m.__doc__ is None]
    if fields:
        lines += ["Fields (as last refreshed): " + ", ".join(f"`{n}`" for n in fields) + ".", ""]
    for member_name, member in shown:
        heading = f"#### `{cls.__name__}.{member_name}`"
        if member_name in fields:
            continue
        if isinstance(member, property):
            lines += [f"{heading} (property)", "", _text(member.__doc__), ""]
        elif callable(member):
            lines += [
                heading,
                "",
                _code(member_name, member),
                "",
                _text(member.__doc__),
                "",
            ]
    return "\n".join(lines)


def _constant(module: ModuleType, name: str) -> str:
    """The comment at the end of the line in `module` that defines the constant `name`."""
    found = re.search(rf"^{name} = .*#\s*(.*)$", inspect.getsource(module), re.M)
    return found.group(1) if found else ""


def _code(name: str, function: Callable) -> str:
    """The call's signature, as a code block."""
    return f"```python\n{name.rsplit('.', 1)[-1]}{_signature(function)}\n```"


def _signature(function: Callable) -> str:
    text = str(inspect.signature(function)).replace("'", "")
    return re.sub(r"\(self,? ?", "(", text)


def _keywords(kinds: dict[str, tuple[str, Any]]) -> str:
    """The keyword options of plan, render, submit and sweep: the plan options
    (mmm_orch/options/plan.py), each in the Python types it takes."""
    from mmm_orch.options.plan import option_fields

    lines = [
        "### Keyword options",
        "",
        "Those of `plan`, `render`, `submit` and `sweep`: the plan options "
        "(`mmm_orch.options.plan.PlanOptions`), as the command line's flags say them.",
        "",
        "| keyword | type | default | |",
        "|---|---|---|---|",
    ]
    for option in option_fields():
        takes = kinds[option.metadata["kind"]][0].replace("|", "\\|")
        said = " ".join(option.metadata["help"].split()).replace("|", "\\|")
        flags = ", ".join(f"`{flag}`" for flag in option.metadata["flags"] if flag.startswith("--"))
        lines.append(
            f"| `{option.name}` | `{takes}` | `{option.default!r}` | {said}"
            + (f" ({flags})" if flags else "")
            + " |"
        )
    return "\n".join([*lines, ""])


def _type(annotation: Any) -> str:
    return (
        annotation
        if isinstance(annotation, str)
        else getattr(annotation, "__name__", str(annotation))
    )


def _text(doc: str | None) -> str:
    """A docstring as markdown: its paragraphs, and its indented examples as code blocks."""
    if not doc:
        return ""
    return inspect.cleandoc(doc).replace("|", "\\|")
