"""The job's software environment: the machine's presets, the device and rendezvous variables,
the workload's and the user's variables, and the job environment's directory."""

from __future__ import annotations

import os
import shlex

from mmm_orch.config.common import check_placeholders
from mmm_orch.config.machine import Machine
from mmm_orch.config.registry import unknown_name
from mmm_orch.config.workload import MachineOverride, Workload
from mmm_orch.errors import MmmError, one_line
from mmm_orch.hosts import job_envs as envs
from mmm_orch.injob import protocol
from mmm_orch.injob.protocol import MODULES
from mmm_orch.limits import ENV_NAME
from mmm_orch.planning.checks import SAFE_WORD, check_text, fail, looks_secret
from mmm_orch.planning.model import (
    SHARE_GROUP,
    Devices,
    EnvEntry,
    EnvGroup,
    Environment,
    Request,
)


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
    for key, value in request.env:
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


def job_environment(
    machine: Machine,
    workload: Workload,
    override: MachineOverride | None,
    request: Request,
    nodes: int,
    devices: Devices,
    python: str,
    account: str | None,
) -> Environment:
    workload_env = dict(workload.env)
    if override:
        workload_env.update(override.env)
    shared = None
    if devices.share is not None and machine.devices.slots is not None:  # a share is of the slots
        shared = EnvGroup(
            name=SHARE_GROUP,
            description="its devices, beside other runs",
            source=machine.devices.slots.source,
            set=devices.share.env,
        )
    groups = env_groups(
        machine,
        workload,
        request,
        nodes,
        list(override.presets) if override else [],
        list(override.no_presets) if override else [],
        _device_env(machine, devices, python),
        workload_env,
        shared,
    )
    path = environment_word(machine, account)
    if request.stage_env and not path:
        raise fail(
            "--stage-env",
            True,
            f"{machine.name} has no job environment to stage (the "
            "jobs run the interpreter that submitted them)",
        )
    stack = machine.stack(request.stack or (override.stack if override else None))
    check_built_on(machine, stack.name)
    return Environment(
        stack=stack.name,
        stack_date=stack.date,
        stack_source=stack.source,
        setup=tuple(stack.lines()),
        groups=tuple(groups),
        path=path,
        stage=request.stage_env,
        stage_dir=machine.environment.stage_dir if machine.environment else "/tmp",
        login_shell=machine.login_shell,
    )


def _device_env(machine: Machine, devices: Devices, python: str) -> list[EnvEntry]:
    """The variables mmm_orch.runtime reads: device, backend, visible devices, rendezvous."""
    entries = [
        EnvEntry(name=protocol.DEVICE_VAR, value=devices.torch),
        EnvEntry(name=protocol.BACKEND_VAR, value=devices.backend),
    ]
    if machine.devices.visible and devices.share is None:  # (a share's own mask instead)
        entries.append(
            EnvEntry(
                name=machine.devices.visible_env, value=",".join(map(str, machine.devices.visible))
            )
        )
    if machine.devices.one_per_rank:
        entries.append(EnvEntry(name=protocol.DEVICE_PER_RANK_VAR, value="1"))
    if machine.rendezvous.master_addr:
        entries.append(EnvEntry(name="MASTER_ADDR", value=machine.rendezvous.master_addr))
    if machine.rendezvous.master_port == "auto":  # a port nobody on the node holds
        entries.append(
            EnvEntry(
                name="MASTER_PORT", value=f"$({shlex.quote(python)} -m {MODULES['rendezvous']})"
            )
        )
    elif machine.rendezvous.master_port:
        entries.append(EnvEntry(name="MASTER_PORT", value=machine.rendezvous.master_port))
    return entries
