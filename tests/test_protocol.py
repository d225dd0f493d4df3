"""The house: what runs inside a job imports only the standard library, the import graph has no
circles and no arrow upward, every marker, exit code and in-job file name is defined once (in
mmm_orch/injob/protocol.py), and the markers a real job prints are read back by the readers."""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO
from helpers.cli import run_cli
from helpers.jobs import wait_state
from mmm_orch.injob import protocol
from mmm_orch.progress.startup import parse_markers

PACKAGE = REPO / "mmm_orch"
INJOB = PACKAGE / "injob"
# Low to high: a module may import from its own layer and the ones before it, never after. The
# package itself (`import mmm_orch`: the Python API's names) is the top.
LAYERS = ["mmm_orch.version", "mmm_orch.errors", "mmm_orch.limits", "mmm_orch.paths",
          "mmm_orch.walltime", "mmm_orch.dataclass_code", "mmm_orch.options", "mmm_orch.models",
          "mmm_orch.injob", "mmm_orch.pretrained", "mmm_orch.hosts.transport", "mmm_orch.schedulers",
          "mmm_orch.config", "mmm_orch.hosts.ssh", "mmm_orch.hosts", "mmm_orch.rendering.sandbox",
          "mmm_orch.hosts.job_envs", "mmm_orch.planning", "mmm_orch.records.balance",
          "mmm_orch.rendering", "mmm_orch.records", "mmm_orch.submission", "mmm_orch.progress",
          "mmm_orch.reporting", "mmm_orch.usecases", "mmm_orch.api.handles", "mmm_orch.api",
          "mmm_orch.runtime", "mmm_orch.trainers", "mmm_orch.cli", "mmm_orch.reference",
          "mmm_orch.__main__", "mmm_orch"]


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _imports(path: Path) -> set[str]:
    """The mmm_orch modules `path` imports anywhere in it (lazy imports in functions too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES]
            out.update(subs)
            if len(subs) < len(node.names):
                out.add(node.module)
    return {name for name in out if name.split(".")[0] == "mmm_orch"}


def _layer(module: str) -> int:
    """The place of the longest entry of LAYERS that is `module` or a package holding it (the
    package itself holds only its own __init__: a new module must be placed)."""
    holders = [name for name in LAYERS
               if module == name or (name != "mmm_orch" and module.startswith(name + "."))]
    assert holders, f"{module}: a package or module that LAYERS does not place"
    return LAYERS.index(max(holders, key=len))


GRAPH = {module: _imports(path) & set(MODULES) - {module} for module, path in MODULES.items()}


def test_nothing_imports_upward():
    upward = [f"{module} -> {target}" for module, targets in GRAPH.items() for target in targets
              if _layer(target) > _layer(module)]
    assert not upward, upward


# What the command line and the Python API may import: the use cases (which say again, for them,
# the words requests, plans and records are said in), the errors, the bounds every layer shares,
# the version, the plan options both are made from (light: the parser reads them at every start),
# and their own presentation (cli/ itself; api/handles.py).
DOOR = ("mmm_orch.usecases", "mmm_orch.errors", "mmm_orch.limits", "mmm_orch.version",
        "mmm_orch.options.plan")
FRONT = {module for module in MODULES if module.split(".")[:2] == ["mmm_orch", "cli"]
         or module in ("mmm_orch.api", "mmm_orch.api.handles")}


def test_the_cli_and_the_api_import_only_the_use_cases():
    assert "mmm_orch.cli.job_cmds" in FRONT and "mmm_orch.api" in FRONT
    below = [f"{module} -> {target}" for module in sorted(FRONT) for target in sorted(GRAPH[module])
             if target not in FRONT and not target.startswith(DOOR)]
    assert not below, below


# The code that runs inside the job (the runtime and the trainers, on a facility's Python) reaches
# nothing of the orchestrator: its profiles and plans, its records, its submission, its use cases
# and its two doors; neither itself nor through a module on the way.
IN_JOB = ("mmm_orch.runtime", "mmm_orch.trainers")
ORCHESTRATOR = ("mmm_orch.config", "mmm_orch.planning", "mmm_orch.records", "mmm_orch.submission",
                "mmm_orch.usecases", "mmm_orch.api", "mmm_orch.cli")


def fence_breaches(graph: dict[str, set[str]], inside: tuple[str, ...],
                   outside: tuple[str, ...]) -> list[str]:
    """For each module of the packages `inside` that reaches a module of `outside`, the shortest
    chain of imports that does: "a -> b -> c". Every import counts, a lazy one in a function too,
    and so does the package an import runs first (mmm_orch.schedulers.base runs
    mmm_orch/schedulers/__init__.py); not the top package, whose names load on first use."""
    def within(module: str, packages: tuple[str, ...]) -> bool:
        return any(module == p or module.startswith(p + ".") for p in packages)

    def imported_by(module: str) -> set[str]:
        package = module.rpartition(".")[0]
        return graph.get(module, set()) | ({package} if package not in ("", "mmm_orch") else set())

    chains = []
    for start in sorted(m for m in graph if within(m, inside)):
        came_from, todo = {start: ""}, [start]
        while todo:  # breadth first: the first forbidden module found has the shortest chain
            module = todo.pop(0)
            if within(module, outside):
                chain = [module]
                while came_from[chain[-1]]:
                    chain.append(came_from[chain[-1]])
                chains.append(" -> ".join(reversed(chain)))
                break
            for target in sorted(imported_by(module) - came_from.keys()):
                came_from[target] = module
                todo.append(target)
    return chains


def test_the_code_inside_a_job_reaches_nothing_of_the_orchestrator():
    assert "mmm_orch.runtime.run_claim" in GRAPH and "mmm_orch.trainers.llama3" in GRAPH
    breaches = fence_breaches(GRAPH, IN_JOB, ORCHESTRATOR)
    assert not breaches, "\n".join(breaches)


def test_the_fence_names_the_chain_that_breaks_it():
    """On a tree of its own: a lazy import of a scheduler whose package imports the config is
    found through the package, and only the modules that reach it are named."""
    graph = {"mmm_orch.runtime.claim": {"mmm_orch.schedulers.local", "mmm_orch.errors"},
             "mmm_orch.runtime.loop": {"mmm_orch.runtime.dist", "mmm_orch.walltime"},
             "mmm_orch.runtime.dist": set(), "mmm_orch.runtime": set(),
             "mmm_orch.schedulers.local": {"mmm_orch.errors"},
             "mmm_orch.schedulers": {"mmm_orch.config.machine"},
             "mmm_orch.trainers.fsdp": {"mmm_orch.runtime.claim"}}
    assert fence_breaches(graph, IN_JOB, ORCHESTRATOR) == [
        "mmm_orch.runtime.claim -> mmm_orch.schedulers.local -> mmm_orch.schedulers -> "
        "mmm_orch.config.machine",
        "mmm_orch.trainers.fsdp -> mmm_orch.runtime.claim -> mmm_orch.schedulers.local -> "
        "mmm_orch.schedulers -> mmm_orch.config.machine"]
    del graph["mmm_orch.runtime.claim"]  # nothing else reaches it
    graph["mmm_orch.trainers.fsdp"] = {"mmm_orch.runtime.loop"}
    assert fence_breaches(graph, IN_JOB, ORCHESTRATOR) == []


def test_the_import_graph_has_no_circles():
    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for target in GRAPH[todo.pop()]:
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        return seen

    circles = sorted({tuple(sorted((a, b))) for a in GRAPH for b in GRAPH[a] if a in reach(b)})
    assert not circles, circles


def test_in_job_code_imports_only_its_own_package():
    for module in (m for m in GRAPH if m.startswith("mmm_orch.injob")):
        assert all(t.startswith("mmm_orch.injob") or t == "mmm_orch" for t in GRAPH[module]), \
            (module, GRAPH[module])


def test_in_job_code_runs_without_the_orchestrators_dependencies():
    """Imported in a fresh interpreter, the in-job programs bring in nothing of the CLI, the job
    database, the profiles or any third-party package."""
    names = [f"mmm_orch.injob.{p.stem}" for p in INJOB.glob("*.py") if p.stem != "__init__"]
    probe = ("import sys\n" + "".join(f"import {name}\n" for name in names) +
             "third = {m.split('.')[0] for m in sys.modules} & {'pydantic', 'yaml', 'jinja2', "
             "'sqlite3', 'psutil', 'paramiko', 'torch', 'numpy'}\n"
             "ours = [m for m in sys.modules if m.startswith('mmm_orch') and m != 'mmm_orch' "
             "and not m.startswith('mmm_orch.injob')]\n"
             "print(sorted(third) + sorted(ours))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# -- defined once -------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _strings(path: Path) -> tuple[str, ...]:
    """The string constants of a Python file, without its docstrings (prose may quote a marker)."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return tuple(node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
                 and isinstance(node.value, str) and id(node) not in docstrings)


MARKERS = {name: value for name, value in vars(protocol).items()
           if name.isupper() and isinstance(value, str) and value.startswith(protocol.PREFIX + " ")}
TRAINER_LINES = [protocol.CHECKPOINT_SAVED, protocol.DIST_CHECK_JSON]
FILES = [value for name, value in vars(protocol).items()
         if name.endswith("_FILE") and isinstance(value, str)]
SOURCES = [p for p in MODULES.values() if p != INJOB / "protocol.py"]
TEMPLATES = sorted((REPO / "templates").glob("*.j2"))


@pytest.mark.parametrize("text", [*MARKERS.values(), *TRAINER_LINES, *FILES])
def test_each_marker_and_file_name_is_written_only_in_the_protocol(text):
    """`[mmm-orch] first_step=` or `failover.json` spelled anywhere else would be a second
    definition that can drift from the first."""
    word = text.removeprefix(protocol.PREFIX + " ").rstrip(" =:")
    spelled = [str(p.relative_to(REPO)) for p in SOURCES
               if any(text in s or (protocol.PREFIX in s and f"] {word}" in s) for s in _strings(p))]
    spelled += [str(p.relative_to(REPO)) for p in TEMPLATES if text in p.read_text()
                or f"{protocol.PREFIX} {word}" in p.read_text()]
    assert not spelled, spelled


VARIABLES = [value for name, value in vars(protocol).items()
             if name.endswith("_VAR") and isinstance(value, str)]


@pytest.mark.parametrize("name", VARIABLES)
def test_each_variable_the_job_hands_its_programs_is_named_only_in_the_protocol(name):
    """`os.environ.get("MMM_RUN_LOCK_WAIT")` in one module and its setting in another would be two
    definitions that can drift apart."""
    spelled = [str(p.relative_to(REPO)) for p in SOURCES if name in _strings(p)]
    assert not spelled, spelled


def test_each_exit_code_is_defined_only_in_the_protocol():
    codes = {name: value for name, value in vars(protocol).items() if name.startswith("EXIT_")}
    assert len(set(codes.values())) == len(codes), codes
    defined = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and any(
                    isinstance(t, ast.Name) and "EXIT" in t.id for t in node.targets):
                defined.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not defined, defined
    for template in TEMPLATES:  # the scripts take them from the protocol too
        text = template.read_text()
        assert not any(f"exit {code}" in text or f"-eq {code} " in text
                       for code in codes.values()), template


# -- what a real job prints is read back --------------------------------------------------------

@pytest.mark.slow
def test_the_markers_of_a_real_job_are_read_by_the_readers(cli, isolated):
    """A job submitted here renders, runs and prints the script's and the trainers' markers; the
    readers (the startup timeline, status's id lookup, the checkpoint reader) read them back."""
    proc = run_cli("submit", "local", "fsdp", "--set", "epochs=1", "--set", "train_samples=256",
                   "--set", "checkpoint_every=1")
    assert proc.returncode == 0, proc.stderr
    row = wait_state(cli, 1, timeout=300)
    assert (row["state"], row["exit_code"]) == ("completed", 0), row
    record = json.loads(cli("show", "1", "--json").out)
    log = Path(record["log_path"]).read_text()

    markers = parse_markers(log)
    assert markers.job_start <= markers.launch_start <= markers.first_step <= markers.launch_end
    assert (markers.nodes, markers.ranks, markers.launch_exit) == (1, 2, 0)
    assert markers.host and markers.startup_s > 0
    assert any(protocol.JOB_ID.search(line) for line in log.splitlines())
    assert any(protocol.JOB_HOST.search(line)["host"] == markers.host
               for line in log.splitlines() if protocol.JOB_HOST.search(line))
    saved = [int(m[1]) for line in log.splitlines() if (m := protocol.SAVED.match(line))]
    assert saved and saved == sorted(saved), log[-3000:]
    assert any(line.startswith(protocol.LAUNCH) for line in log.splitlines())
    metrics = Path(record["run_dir"]) / protocol.METRICS_FILE
    assert metrics.is_file()




def test_the_in_job_programs_take_their_options_from_the_protocol():
    """One definition of the options the job script passes the watchdog, failover (the
    watchdog's too, for each attempt), the chain and the screen: their parsers and the templates
    (`job.option`) both spell them from protocol.OPTIONS."""
    import re

    from mmm_orch.injob import chain, failover, screen, watchdog

    parsers = [watchdog.build_parser(), failover.build_parser(), chain.build_parser(),
               screen.build_parser()]
    flags = {flag for parser in parsers for action in parser._actions
             for flag in action.option_strings if flag not in ("-h", "--help")}
    assert flags == set(protocol.OPTIONS.values())
    guard = {a.dest: (a.type, a.default, a.required) for a in watchdog.build_parser()._actions}
    assert all(guard[a.dest] == (a.type, a.default, a.required)
               for a in failover.build_parser()._actions if a.dest in guard)
    for template in TEMPLATES:
        text = template.read_text()
        spelled = [flag for flag in protocol.OPTIONS.values()
                   if re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text)]
        assert not spelled, (template.name, spelled)


def test_no_module_of_the_package_has_an_api_name():
    """`import mmm_orch.X` binds X on the package: a module named as an API function (`render`)
    would hide that function from `mmm_orch.X(...)`."""
    import mmm_orch

    clashes = sorted(f"mmm_orch.{name}" for name in mmm_orch._API if f"mmm_orch.{name}" in MODULES)
    assert not clashes, clashes
