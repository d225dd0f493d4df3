"""The job environment on a machine (`mmm-orch env create|check`): a virtual environment with
this mmm-orch in it, made or checked on the machine's login host, and remembered so that its jobs
activate it. Returns what the environment reports; printing is the caller's."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import posixpath
import shlex
import time
from collections.abc import Callable
from typing import Any

from mmm_orch.config.machine import Machine, Stack
from mmm_orch.config.registry import load_machine
from mmm_orch.errors import MmmError
from mmm_orch.hosts import host_for
from mmm_orch.hosts import job_envs as envs
from mmm_orch.hosts.transport import CommandResult
from mmm_orch.planning.checks import check_text
from mmm_orch.planning.environment import environment_word
from mmm_orch.submission.preflight import login_target
from mmm_orch.version import __version__


@dataclasses.dataclass(frozen=True)
class Where:
    machine: Machine
    target: str  # the SSH target of its login host, "" for this computer
    word: str  # the environment's directory, as a shell word
    stack: Stack  # the machine's software stack it is made on

    @property
    def said(self) -> str:
        return f" on {self.target}" if self.target else ""


def where(
    machine_name: str,
    host: str | None,
    path: str | None,
    account: str | None,
    stack: str | None = None,
    made: bool = False,
) -> Where:
    """The machine, the login host to work on, the environment's directory (`path`, else the
    profile's place for `account`) and the stack it is made on: `stack`, else (`made`: an
    environment made before) the one it was made on, else the machine's default."""
    machine = load_machine(machine_name)
    if stack is None and made:
        stack = envs.built_on(machine.name, [s.name for s in machine.stacks])
    on = machine.stack(stack)
    check_text(f"machine {machine.name}: python", machine.python)  # a word of the check's bash
    target = login_target(
        machine.name,
        machine.scheduler.kind,
        dataclasses.asdict(machine.scheduler.commands),
        machine.login_hosts,
        host,
    )
    if path is not None:
        if not os.path.isabs(check_text("--path", path)):
            raise MmmError(f"--path {path!r} is invalid: give an absolute path on {machine.name}")
        return Where(machine, target, shlex.quote(path), on)
    account = account or os.environ.get("MMM_ORCH_ACCOUNT") or machine.account.default
    word = environment_word(machine, account)
    if not word:
        raise MmmError(
            f"machine {machine.name} has no job environment (its jobs run "
            f"`{machine.python}`); give --path DIR to make one"
        )
    return Where(machine, target, word, on)


def _run(target: str, script: str) -> CommandResult:
    return host_for(target).run(["bash", "-lc", script], timeout=900)


def create(at: Where, said: Callable[[str], None]) -> dict[str, Any]:
    """Build this mmm-orch's wheel, upload it, make the environment with it (`said`: each step
    as it is done), and remember it for the machine's jobs; its report."""
    name, wheel = envs.build_wheel()
    host = host_for(at.target)
    wheels = posixpath.join(host.home(), ".cache", "mmm-orch", "wheels")
    wheel_path = posixpath.join(wheels, name)
    made: list[str] = []
    had_wheel = True  # until known: a wheel that may have been there already is kept
    try:
        try:
            made = host.make_private_dir(wheels) if host.size(wheels) is None else []
            had_wheel = host.size(wheel_path) is not None
            host.write_file(wheel_path, wheel, 0o644)
        except OSError as exc:
            raise MmmError(
                f"env create {at.machine.name}{at.said}: cannot upload the wheel to "
                f"{wheel_path}: {exc.strerror or exc}"
            ) from None
        said(f"uploaded {name} ({len(wheel) // 1024} KiB) to {wheel_path}{at.said}")
        result = _run(at.target, envs.create_script(at.stack.lines(), at.word, wheel_path))
        for line in result.stdout.splitlines():
            if line.startswith(envs.STEP):
                said(line.removeprefix(envs.STEP))
        report = envs.read_report(result.stdout)
        if result.returncode != 0 or report is None or report["mmm_orch"] != __version__:
            tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
            raise MmmError(
                f"env create {at.machine.name}{at.said} failed: {' | '.join(tail) or 'no output'}"
            )
    except BaseException:
        # Nothing of a failed create stays: the wheel and the directories made for it (the
        # script removes an environment directory it made). The failure is what is reported,
        # not one of the clean-up's.
        with contextlib.suppress(Exception):
            if not had_wheel:
                host.run(["rm", "-f", "--", wheel_path])
            host.remove_tree(made)
        raise
    envs.remember(
        at.machine.name,
        {
            "path": report["prefix"],
            "host": at.target,
            "version": __version__,
            # A stack of a profile without named stacks (its "default") says nothing of the software.
            **({"stack": at.stack.name} if at.stack.date else {}),
            "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        },
    )
    return report


def check(at: Where) -> dict[str, Any]:
    """What the environment holds, or an error saying what is missing there."""
    result = _run(
        at.target, envs.check_script(at.stack.lines(), envs.activation(at.word), at.machine.python)
    )
    report = envs.read_report(result.stdout)
    if report is None or report["mmm_orch"] != __version__:
        raise MmmError(
            envs.missing_message(at.machine.name, report, at.target, result.stderr or result.stdout)
        )
    return report


def remembered_in() -> str:
    return str(envs.config_file())
