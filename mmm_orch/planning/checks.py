"""Checks of the values a plan carries into the job script: one line of text, names that are
names, no secrets; a failure names the field, the value and what is allowed."""

from __future__ import annotations

import os
import re
from typing import Any

from mmm_orch.config.common import check_placeholders
from mmm_orch.config.machine import Machine
from mmm_orch.config.workload import Workload
from mmm_orch.errors import InvalidValue, MmmError
from mmm_orch.limits import ENV_NAME

# Account, queue and job names reach scheduler directives, which are not shell-quoted.
SAFE_WORD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,62}\Z")  # \Z: "$" lets "proj\n" by
JOB_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,62}\Z")
# Scripts, logs and the job database are readable: secrets never go into them. A name is
# refused when it contains one of these, or when one of its _-separated words is a secret word.
_SECRET = re.compile(r"(TOKEN|SECRET|PASSW|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL)", re.I)
_SECRET_WORDS = {"KEY", "KEYS", "PAT", "PASS", "PWD", "AUTH", "COOKIE", "SESSION", "SIGNATURE"}
_NOT_SECRET = {"PWD", "OLDPWD"}  # the shell's working directories


def looks_secret(name: str) -> bool:
    words = set(name.upper().split("_"))
    return name.upper() not in _NOT_SECRET and bool(_SECRET.search(name) or words & _SECRET_WORDS)


def check_text(field: str, value: str) -> str:
    """One line of text: no control characters, nothing that is not valid Unicode (such a value
    cannot be written into the UTF-8 job script, or reach the job intact)."""
    if value.isprintable():  # none of those (a plan checks ~50 texts): no loop over characters
        return value
    bad = sorted({c for c in value if ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) <= 0xDFFF})
    if bad:
        shown = ", ".join(
            repr(c) if not 0xD800 <= ord(c) <= 0xDFFF else "a byte that is not UTF-8" for c in bad
        )
        raise InvalidValue(
            field,
            value,
            "one line of text",
            f"{field} {value!r} is invalid: it contains {shown}; values are one line of text",
        )
    return value


def bounded(
    field: str, value: Any, low: float, high: float, allowed: str, whole: bool = False
) -> Any:
    """`value` when it is a number (a bool is not; with `whole`, an int) from `low` to `high`.
    Every number a user or a file gives passes here before arithmetic uses it: a NaN passes
    every comparison, an infinity or a 401-digit integer overflows a float. Else InvalidValue
    naming the field, the value (shown short) and what is allowed."""
    kinds = (int,) if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not low <= value <= high:
        raise InvalidValue(field, value, allowed)
    return value


def fail(field: str, value: Any, allowed: str) -> InvalidValue:
    return InvalidValue(field, value, allowed)


def check_script_text(machine: Machine, workload: Workload) -> None:
    """Profile and spec fields the script carries outside the setup lines (comments, directives,
    shell names, double-quoted values). A user's own YAML is data: a line break in a comment or a
    directive would start a shell line of its own, a name must be a name."""
    where = f"machine {machine.name}"
    texts = [
        ("machine name", machine.name),
        ("workload name", workload.name),  # names first
        (f"{where}: python", machine.python),
        (f"{where}: launcher.cpu_bind", machine.launcher.cpu_bind),
        (f"{where}: facility", machine.facility),
        (f"{where}: scheduler.queue_directive", machine.scheduler.queue_directive),
        (f"{where}: scheduler.exclude_directive", machine.scheduler.exclude_directive),
        (f"{where}: devices.source", machine.devices.source),
        (
            f"{where}: devices.slots.source",
            machine.devices.slots.source if machine.devices.slots else "",
        ),
        (f"{where}: rendezvous.source", machine.rendezvous.source),
    ]
    texts += [(f"{where}: directive", d) for d in machine.directives]
    texts += [
        (f"{where}: scheduler.failover_directives", d)
        for d in machine.scheduler.failover_directives
    ]
    for queue in machine.queues:
        texts.append((f"{where}: queue name", queue.name))
        texts += [(f"{where}: queue {queue.name} tier name", t.name) for t in queue.tiers]
        texts += [(f"{where}: queue {queue.name} directive", d) for d in queue.directives or ()]
    for preset in machine.presets:
        texts += [
            (f"{where}: preset name", preset.name),
            (f"{where}: preset {preset.name} description", preset.description),
            (f"{where}: preset {preset.name} source", preset.source),
        ]
        texts += [
            (f"{where}: preset {preset.name} {var} source", spec.source)
            for var, spec in preset.set.items()
            if not isinstance(spec, str)
        ]
    for field_name, text in texts:
        check_text(field_name, text)
    scheduler = machine.scheduler
    templates = [
        (f"{where}: scheduler.queue_directive", scheduler.queue_directive, "queue"),
        (f"{where}: scheduler.exclude_directive", scheduler.exclude_directive, "nodes"),
    ]
    templates += [
        (f"{where}: queue {q.name} directive", d, "queue")
        for q in machine.queues
        for d in q.directives or ()
    ]
    for field_name, template, placeholder in templates:
        try:
            check_placeholders(template, (placeholder,))
        except ValueError as exc:
            raise MmmError(f"{field_name}: {exc}") from None
    names = [
        (f"{where}: scheduler.submit_dir_var", machine.scheduler.submit_dir_var),
        (f"{where}: devices.visible_env", machine.devices.visible_env),
    ]
    for preset in machine.presets:
        names += [
            (f"{where}: preset {preset.name} variable", n) for n in (*preset.set, *preset.unset)
        ]
    names += [(f"workload {workload.name}: env variable", n) for n in workload.env]
    names += [
        (f"workload {workload.name}: machines.{m}.env variable", n)
        for m, override in workload.machines.items()
        for n in override.env
    ]
    for field_name, name in names:
        if name and not ENV_NAME.fullmatch(name):
            raise fail(
                field_name,
                name,
                "an environment variable name: letters, digits and _, not starting with a digit",
            )
    # Written in double quotes so that $VARS expand, as a profile's preset values are.
    envs = [(f"workload {workload.name}: env {k}", v) for k, v in workload.env.items()]
    envs += [
        (f"workload {workload.name}: machines.{m}.env {k}", v)
        for m, override in workload.machines.items()
        for k, v in override.env.items()
    ]
    for field_name, value in envs:
        if '"' in check_text(field_name, value) or "`" in value:
            raise fail(
                field_name,
                value,
                "a workload's env value may not contain \" or ` "
                "(it is written in double quotes, where $VARS expand)",
            )


def workdir(given: str | None) -> str:
    """The directory the job runs in: --workdir (checked where the job runs, at submission), else
    the current directory."""
    if given is not None:
        if not given:
            raise fail("--workdir", given, "name a directory")
        return os.path.abspath(check_text("--workdir", given))
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise MmmError(
            "the current directory no longer exists: cd to one that does, or give --workdir"
        ) from None
