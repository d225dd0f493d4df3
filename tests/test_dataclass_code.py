"""The dataclasses of the config and the plan, their generated code compiled once and kept in the
cache directory: made exactly as dataclasses makes them, and the table is only ever a cache."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from dataclasses import field

import pytest

from mmm_orch.dataclass_code import dataclass

MADE = (
    "import sys\n"
    "from mmm_orch import dataclass_code\n"
    "import mmm_orch.planning, mmm_orch.config.machine, mmm_orch.config.workload\n"
    "print(dataclass_code._added, len(dataclass_code._table))\n"
)


def _made_here(cwd) -> tuple[int, int]:
    """(methods compiled, entries in the table) of a new process importing the models."""
    proc = subprocess.run([sys.executable, "-c", MADE], capture_output=True, text=True, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    added, entries = proc.stdout.split()
    return int(added), int(entries)


def _shapes(cls: type) -> dict[str, object]:
    """What dataclasses generated for `cls`: each method's code, without where it was made."""
    out = {}
    for name in ("__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__"):
        fn = vars(cls).get(name)
        code = getattr(getattr(fn, "__wrapped__", fn), "__code__", None)
        out[name] = code and (code.co_code, code.co_consts, code.co_names, code.co_varnames,
                              code.co_name)
    out["annotations"] = vars(cls)["__init__"].__annotations__
    out["params"] = repr(cls.__dataclass_params__)
    return out


def _pair(**options):
    """The same class made by dataclasses and by dataclass_code."""
    def body(ns):
        ns["__annotations__"] = {"a": int, "b": "list[str]", "c": "str"}
        ns["b"] = field(default_factory=list, hash=False)
        ns["c"] = field(default="x", compare=False)
    ours = dataclass(**options)(type("Point", (), _namespace(body)))
    theirs = dataclasses.dataclass(**options)(type("Point", (), _namespace(body)))
    return ours, theirs


def _namespace(body) -> dict:
    ns: dict = {"__module__": __name__, "__qualname__": "Point"}
    body(ns)
    return ns


@pytest.mark.parametrize("options", [{}, {"frozen": True}, {"frozen": True, "kw_only": True},
                                     {"eq": False}, {"order": True}])
def test_classes_are_made_as_dataclasses_makes_them(options):
    ours, theirs = _pair(**options)
    assert _shapes(ours) == _shapes(theirs)
    made = [(cls(a=1), cls(a=1)) for cls in (ours, theirs)]
    assert [repr(a) for a, _ in made] == ["Point(a=1, b=[], c='x')"] * 2
    assert [a == b for a, b in made] == [options.get("eq", True)] * 2
    if options.get("frozen"):
        for a, b in made:
            with pytest.raises(dataclasses.FrozenInstanceError):
                a.a = 2
            assert hash(a) == hash(b)
    assert "exec" not in vars(dataclasses)  # nothing of dataclasses is left changed


@pytest.mark.slow  # fresh interpreters, seconds each
def test_the_table_is_filled_once_and_then_read(isolated):
    added, entries = _made_here(isolated)
    assert added > 100 and entries == added  # the first process compiles, and saves at exit
    assert _made_here(isolated) == (0, entries)  # the next compiles nothing
    table = next((isolated.parent / "cache" / "mmm-orch").glob("dataclasses-*.marshal"))
    table.write_bytes(b"\x00not marshal")
    assert _made_here(isolated)[0] == added  # a damaged table costs the compiling, no more
    assert _made_here(isolated) == (0, entries)


@pytest.mark.slow  # fresh interpreters, seconds each
def test_an_unwritable_cache_directory_costs_only_speed(isolated):
    (isolated.parent / "cache").write_text("a file where the directory would be")
    assert _made_here(isolated)[0] > 100
    assert _made_here(isolated)[0] > 100


@pytest.mark.slow  # fresh interpreters, seconds each
def test_a_warm_render_imports_neither_validation_library(isolated):
    """annotated_types and typing_extensions (with pydantic) only validate a changed file."""
    probe = ("import sys\nfrom mmm_orch.cli import main\nsys.stdout = open('/dev/null', 'w')\n"
             "main(['render', 'polaris', 'fsdp', '-A', 'P'])\nsys.stdout = sys.__stdout__\n"
             "print(sorted(m for m in ('annotated_types', 'typing_extensions', 'pydantic')"
             " if m in sys.modules))\n")
    runs = [subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           cwd=isolated).stdout.strip() for _ in range(2)]
    assert runs[0] != "[]" and runs[1] == "[]"


def test_bounds_are_annotated_types_own_to_pydantic():
    from typing import Annotated

    import annotated_types
    from pydantic import TypeAdapter, ValidationError

    from mmm_orch.config.common import Bound

    assert list(Bound("Le", 60)) == [annotated_types.Le(60)]
    assert Bound("Ge", 1) == Bound("Ge", 1) and hash(Bound("Ge", 1)) == hash(Bound("Ge", 1))
    ours = TypeAdapter(Annotated[float, Bound("Ge", 0), Bound("Le", 60)])
    theirs = TypeAdapter(Annotated[float, annotated_types.Ge(0), annotated_types.Le(60)])
    assert ours.core_schema == theirs.core_schema and ours.json_schema() == theirs.json_schema()
    for value in (-1, 61):
        with pytest.raises(ValidationError) as ours_error:
            ours.validate_python(value)
        with pytest.raises(ValidationError) as theirs_error:
            theirs.validate_python(value)
        assert ours_error.value.errors() == theirs_error.value.errors()
