"""The job's software environment: the machine's presets, the device and rendezvous variables,
the workload's and the user's variables, and the job environment's directory."""

from __future__ import annotations

import os
import shlex

from mmm_orch.config.common import ENV_NAME, check_placeholders
from mmm_orch.config.machine import Machine
from mmm_orch.config.registry import unknown_name
from mmm_orch.config.workload import Workload
from mmm_orch.errors import MmmError, one_line
from mmm_orch.hosts import job_envs as envs
from mmm_orch.planning.checks import SAFE_WORD, check_text, fail, looks_secret, pairs
from mmm_orch.planning.model import EnvEntry, EnvGroup, Request


def env_groups(
    machine: Machine,
    workload: Workload,
    request: Request,
    nodes: int,
    override_presets: list[str],
    override_no_presets: list[str],
    device_env: list[EnvEntry],
    workload_env: dict[str, str],
    share: EnvGroup | None = None,
) -> list[EnvGroup]:
    """The variables in groups, in the order the script sets them: the presets, the device and
    rendezvous variables (`share`: a run's own devices of a node, after them), the workload's,
    the user's --env."""
    for name in (*request.presets, *request.no_presets, *override_presets, *override_no_presets):
        if machine.preset(name) is None:
            raise unknown_name(f"preset on {machine.name}", name, [p.name for p in machine.presets])
    wanted = {p.name for p in machine.presets if p.default}
    wanted |= set(override_presets)
    wanted -= set(override_no_presets)
    wanted |= set(request.presets)
    wanted -= set(request.no_presets)

    groups: list[EnvGroup] = []
    owner: dict[str, tuple[str, str]] = {}
    for preset in machine.presets:
        if preset.name not in wanted or not preset.applies_to(nodes):
            continue
        entries = []
        for var, spec in preset.set.items():
            value, source = (spec, "") if isinstance(spec, str) else (spec.value, spec.source)
            if var in owner and owner[var][1] != value:
                raise MmmError(
                    f"presets {owner[var][0]!r} and {preset.name!r} set {var} to "
                    f"{owner[var][1]!r} and {value!r}: disable one with --no-preset"
                )
            owner[var] = (preset.name, value)
            entries.append(EnvEntry(name=var, value=value, source=source))
        groups.append(
            EnvGroup(
                name=f"preset {preset.name}",
                description=preset.description,
                source=preset.source,
                set=tuple(entries),
                unset=tuple(preset.unset),
            )
        )
    groups.append(
        EnvGroup(
            name="device and rendezvous",
            description="read by mmm_orch.runtime",
            source=machine.devices.source or machine.rendezvous.source,
            set=tuple(device_env),
        )
    )
    if share is not None:
        groups.append(share)
    if workload_env:
        groups.append(
            EnvGroup(
                name=f"workload {workload.name}",
                set=tuple(EnvEntry(name=k, value=v) for k, v in workload_env.items()),
            )
        )
    user = []
    for key, value in pairs(request.envs, "--env"):
        check_text(f"--env {key}", value)
        if not ENV_NAME.fullmatch(key):  # match() would pass a name ending in a newline
            raise fail("--env", key, "names are letters, digits and _, not starting with a digit")
        if looks_secret(key):
            raise MmmError(
                f"--env {key}: refusing to write a secret into the job script, its log and the job "
                f"database; set it in your shell startup file on {machine.name} instead"
            )
        user.append(EnvEntry(name=key, value=value, literal=True))
    if user:
        groups.append(EnvGroup(name="user --env", set=tuple(user)))
    return groups


def check_built_on(machine: Machine, stack: str) -> None:
    """A job environment made on one stack has that stack's Python and torch under it: a job on
    another stack is refused (one made before environments recorded their stack, or on a profile
    without named stacks, records none and passes)."""
    entry = envs.remembered(machine.name) or {}
    built_on = entry.get("stack")
    if isinstance(built_on, str) and built_on != stack:
        kept = any(s.name == built_on for s in machine.stacks)
        raise MmmError(
            f"--stack {stack}: the job environment of {machine.name} ({one_line(str(entry.get('path')))}) was made "
            f"on stack {one_line(built_on)}; make one on {stack} in a new directory: `mmm-orch env "
            f"create {machine.name} --stack {stack} --path DIR`"
            + (
                f", or submit with --stack {built_on}"
                if kept
                else " (the profile no longer has it)"
            )
        )


def environment_word(machine: Machine, account: str | None) -> str:
    """The job environment's directory as a shell word: the one `env create` made for this
    machine, else the profile's default place; '' for machines without one."""
    if entry := envs.remembered(machine.name):
        path = entry["path"]
        if not isinstance(path, str) or not os.path.isabs(check_text("environment path", path)):
            raise MmmError(
                f"{envs.config_file()}: the environment of {machine.name} {path!r} is "
                f"invalid: an absolute path; run `mmm-orch env create {machine.name}`"
            )
        return shlex.quote(path)
    if machine.environment is None:
        return ""
    # The word is double-quoted so that $USER expands: the account must be a plain word (env
    # create and env check reach here without resolve()'s own check).
    if account and not SAFE_WORD.match(account):
        raise fail("--account", account, "use letters, digits, '_', '.', '+', '-'")
    template = machine.environment.path
    try:
        check_placeholders(template, ("account", "account_lower"))
    except ValueError as exc:
        raise MmmError(f"machine {machine.name}: environment.path: {exc}") from None
    if ("{account" in template) and not account:
        raise MmmError(
            f"--account is needed on {machine.name}: the job environment lives under "
            f"the project ({template})"
        )
    path = template.format(account=account or "", account_lower=(account or "").lower())
    return f'"{path}"'  # a profile value: $USER and friends expand where it is used
