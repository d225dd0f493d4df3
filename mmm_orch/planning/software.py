"""`mmm-orch machines check`'s software half: each of a profile's stacks loaded in a clean shell
as a job would load it (one shell per stack), and every difference from what the profile says:
a module tree that is not there, a setup line that fails (the module system's own words), the
torch or Python version, `import torch`, the variables the profile relies on. The last check of
each machine and stack is kept (`last_check`); submissions read it before the queue (`gate`)."""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmm_orch.errors import MmmError
from mmm_orch.injob import protocol

if TYPE_CHECKING:  # (the CLI reads STACK_TIMEOUT for its help: no profile code at its start)
    from mmm_orch.config.machine import Machine, Stack

# One stack's shell may take this long: a module system reading a large tree, a framework module
# on a busy login node and the first `import torch` from a shared filesystem take tens of seconds
# (a cold torch import on Lustre ~20 s); longer is a hang (a module waiting on a dead filesystem).
STACK_TIMEOUT = 120
# A stack checked longer ago than this is submitted with a note: facilities change their default
# stacks with their maintenance (ALCF and NERSC announce one about every two to four weeks).
CHECK_MAX_AGE_DAYS = 14

_MARK = "@@mmm-orch-check "
# A module system's error that a setup line's exit status may not show.
MODULE_ERROR = re.compile(protocol.MODULE_ERROR, re.M)
# The interpreter's report: its version, and each package's (its arguments) or why it does not
# import.
_VERSIONS = (
    "import importlib, importlib.metadata, json, sys\n"
    "out, errors = {'python': sys.version.split()[0]}, {}\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n"
    "        module = importlib.import_module(name)\n"
    "        out[name] = str(getattr(module, '__version__', '') or importlib.metadata.version(name))\n"
    "    except Exception as exc:\n"
    "        errors[name] = f'{type(exc).__name__}: {exc}'\n"
    f"print({_MARK!r} + 'versions ' + json.dumps({{'versions': out, 'errors': errors}}))\n"
)


@dataclass
class StackCheck:
    """What the check of one stack found: `findings` are the differences (empty: all match);
    `read` what it read (versions, variables) for the report."""

    stack: str
    findings: list[str] = field(default_factory=list)
    read: dict[str, str] = field(default_factory=dict)


def script(stack: Stack, python: str) -> str:
    """The shell text that loads `stack` line by line, stopping at the first that fails, then
    reports the variables of its `sets` and what `python` gives. Everything it prints goes to
    one stream, marked, so that each line's own messages stay with it."""
    out = ["exec 2>&1", "set -o pipefail", f"mark() {{ printf '\\n%s%s\\n' {_MARK!r} \"$*\"; }}"]
    if stack.module_tree:
        tree = shlex.quote(stack.module_tree)
        out.append(f"[ -d {tree} ] || mark tree-missing")
    for number, line in enumerate(stack.lines()):
        out += [
            f"mark step {number}",
            f"eval {shlex.quote(line)} || {{ mark failed {number} $?; exit 0; }}",
        ]
    out.append("mark steps-done")
    for name in stack.sets:
        out.append(
            f'if [ -n "${{{name}+x}}" ]; then mark var {name} "$(printf %s "${name}" | base64 -w0)"; '
            f"else mark unset {name}; fi"
        )
    packages = ["torch", *sorted(set(stack.gives) - {"python", "torch"})]
    out.append(
        f"{shlex.quote(python)} -c {shlex.quote(_VERSIONS)} {' '.join(map(shlex.quote, packages))}"
        " || mark python-failed $?"
    )
    return "\n".join(out) + "\n"


def clean_shell(machine: Machine, text: str, timeout: float) -> list[str]:
    """The command that runs `text` in a clean shell as the machine's jobs start theirs (a
    login shell, or not), with nothing of this environment but HOME, USER, LOGNAME and a plain
    PATH; timeout(1) ends it and everything it started (its process group) after `timeout` s."""
    shell = "bash -l" if machine.login_shell else "bash --noprofile --norc"
    return [
        "bash",
        "-c",
        f'exec timeout -k 2 {timeout:g} env -i HOME="$HOME" USER="$USER" '
        f'LOGNAME="$LOGNAME" PATH=/usr/local/bin:/usr/bin:/bin {shell} -c {shlex.quote(text)}',
    ]


def python_of(machine: Machine) -> str:
    """The interpreter a job's launch runs: this one for `python: auto`, else the profile's
    (found on the PATH the stack leaves, as in the job)."""
    return sys.executable if machine.python == "auto" else machine.python


def check_stack(machine: Machine, stack: Stack, run, timeout: float = STACK_TIMEOUT) -> StackCheck:
    """Load `stack` with `run(argv, timeout)` (a host's runner) and compare."""
    text = script(stack, python_of(machine))
    started = time.monotonic()
    try:
        result = run(clean_shell(machine, text, timeout), timeout=timeout + 10)
    except subprocess.TimeoutExpired:
        result = None
    if result is None or result.returncode in (124, 137):
        return StackCheck(
            stack.name,
            [
                f"loading it did not finish within {timeout:.0f} s (stopped after "
                f"{time.monotonic() - started:.0f} s): a module hangs{_last_step(stack, result)}"
            ],
        )
    return compare(stack, result.stdout + result.stderr, python_of(machine))


def _last_step(stack: Stack, result) -> str:
    if result is None:
        return ""
    steps = [int(n) for n in re.findall(rf"^{re.escape(_MARK)}step (\d+)$", result.stdout, re.M)]
    return f" at `{stack.lines()[steps[-1]]}`" if steps else ""


def compare(stack: Stack, output: str, python: str = "python3") -> StackCheck:
    """The findings from the marked output of `script`."""
    found = StackCheck(stack.name)
    sections = _sections(output)
    if "tree-missing" in sections:
        found.findings.append(f"module tree {stack.module_tree} is not there")
    lines = stack.lines()
    for number, line in enumerate(lines):
        said = sections.get(f"step {number}", "").strip()
        failed = re.search(rf"^{re.escape(_MARK)}failed {number} (\d+)$", output, re.M)
        if failed or MODULE_ERROR.search(said):
            why = _module_words(said) or f"exit {failed.group(1) if failed else 0}"
            found.findings.append(f"`{line}` failed: {why}")
            return found  # a job stops there: nothing after it is read
    values = {
        m.group(1): _decode(m.group(2))
        for m in re.finditer(rf"^{re.escape(_MARK)}var (\S+) (\S*)$", output, re.M)
    }
    for name, wanted in stack.sets.items():
        if name not in values:
            found.findings.append(f"{name} is not set; the profile says {wanted}")
        elif values[name] != wanted:
            found.findings.append(f"{name}={values[name]}; the profile says {wanted}")
        else:
            found.read[name] = values[name]
    versions = re.search(rf"^{re.escape(_MARK)}versions (\{{.*\}})$", output, re.M)
    if versions is None:
        parts = re.split(rf"^{re.escape(_MARK)}python-failed .*$", output, flags=re.M)
        printed = re.sub(rf"^{re.escape(_MARK)}.*$", "", parts[0], flags=re.M).strip().splitlines()
        found.findings.append(
            f"its Python ({python}) did not run: " + (printed[-1] if printed else "no output")[:300]
        )
        return found
    report = json.loads(versions.group(1))
    read, errors = report["versions"], report["errors"]
    found.read.update({name: str(version) for name, version in read.items()})
    for package, prefix in stack.gives.items():
        if package in errors:
            found.findings.append(f"import {package} failed: {str(errors[package])[:300]}")
        elif not same_version(str(read.get(package, "")), prefix):
            found.findings.append(f"{package} {read.get(package)}; the profile says {prefix}")
    if "torch" in errors and "torch" not in stack.gives:  # said, though the profile expects none
        found.read["torch"] = f"not importable ({str(errors['torch'])[:200]})"
    return found


def same_version(version: str, prefix: str) -> bool:
    """`version` starts with `prefix` at a component's end: 2.13.0 and 2.13.0a0+git are 2.13;
    2.1 is not 2.13."""
    return version.startswith(prefix) and not version[len(prefix) : len(prefix) + 1].isdigit()


def _sections(output: str) -> dict[str, str]:
    """The text after each marker, up to the next."""
    parts = re.split(rf"^{re.escape(_MARK)}(.*)$", output, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def _module_words(said: str) -> str:
    """A module system's message as one line: its error line and what it names, without the
    advice around it (Lmod's "Please check the spelling...")."""
    lines = [line.strip() for line in said.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if MODULE_ERROR.match(line):
            words = [line]
            for more in lines[i + 1 : i + 3]:
                if more.startswith(("Please", "Also", "It is also", "While processing")):
                    break
                words.append(more)
            return " ".join(words)[:400]
    return " ".join(lines[-2:])[:400]


def _decode(text: str) -> str:
    try:
        return base64.b64decode(text).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return text


# -- the last check, kept per machine ---------------------------------------------------------


def checks_dir() -> Path:
    """Where the last checks are kept: $XDG_STATE_HOME/mmm-orch/software-checks (beside the job
    database's default place)."""
    from mmm_orch.paths import state_home

    return state_home() / "software-checks"


def _file(machine: str) -> Path:
    return checks_dir() / f"{machine}.json"


def save_checks(
    machine: str, host: str, checks: list[StackCheck], when: float | None = None
) -> None:
    """Keep these checks as the machine's last (stacks not checked now keep theirs)."""
    kept = _read(machine)
    stamp = time.time() if when is None else when
    for check in checks:
        kept[check.stack] = {"time": stamp, "host": host, **asdict(check)}
    path = _file(machine)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"machine": machine, "stacks": kept}, indent=1))
        tmp.replace(path)
    except OSError as exc:
        raise MmmError(
            f"machines check: cannot keep the result in {path}: {exc.strerror}"
        ) from None


def _read(machine: str) -> dict[str, Any]:
    from mmm_orch.paths import NotReadable, read_regular

    try:
        data = json.loads(read_regular(_file(machine), 1 << 20))
        stacks = data["stacks"]
        return stacks if isinstance(stacks, dict) else {}
    except (OSError, NotReadable, ValueError, KeyError, TypeError):
        return {}  # none, or unreadable: as never checked


def last_check(machine: str, stack: str) -> dict[str, Any] | None:
    entry = _read(machine).get(stack)
    if not isinstance(entry, dict) or not isinstance(entry.get("time"), (int, float)):
        return None
    if not isinstance(entry.get("findings"), list):
        return None
    return entry


def gate(machine: str, stack: str, now: float | None = None) -> str:
    """Before the queue: refuse a stack whose last check found it broken (MmmError); '' when a
    recent check found it whole, else a one-line note that it was not checked lately."""
    entry = last_check(machine, stack)
    command = f"`mmm-orch machines check {machine}`"
    if entry is None:
        return f"note: stack {stack} of {machine} has never been checked here; {command} checks it"
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry["time"]))
    where = f" on {entry['host']}" if entry.get("host") else ""
    if entry["findings"]:
        raise MmmError(
            f"stack {stack} of {machine}: the last check ({when}{where}) found "
            f"{'; '.join(str(f) for f in entry['findings'])}; fix the profile or pick "
            f"another stack (--stack), then {command}"
        )
    age = ((time.time() if now is None else now) - entry["time"]) / 86400
    if age > CHECK_MAX_AGE_DAYS:
        return (
            f"note: stack {stack} of {machine} was last checked {age:.0f} days ago ({when}); "
            f"{command} checks it again"
        )
    return ""
