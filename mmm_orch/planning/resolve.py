"""Resolve a request (machine, workload, CLI options) into one validated, immutable plan, one
section at a time: the trainer's options and the profiling here; the layout, devices, placement
and launch in planning/launch_layout.py; the queue, walltime and account in
planning/queue_choice.py; the environment in planning/environment.py; memory and cost in theirs.

Data flows one way: Request -> Plan -> script -> submission -> record. Every failure is an
MmmError naming the field, the value and what is allowed, raised before anything is written.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from typing import Any

from mmm_orch.config.machine import Machine
from mmm_orch.config.registry import load_machine, load_workload, unknown_name
from mmm_orch.config.workload import LAYOUT_OPTIONS, Workload
from mmm_orch.errors import InvalidValue, MmmError
from mmm_orch.injob import protocol, windows
from mmm_orch.planning import (
    checks,
    cost,
    environment,
    launch_layout,
    memory,
    pretrained,
    queue_choice,
)
from mmm_orch.planning.checks import JOB_NAME, fail
from mmm_orch.planning.model import (
    Guard,
    Plan,
    ProfilePlan,
    QueuePlan,
    Request,
    Screen,
    Stragglers,
    Transport,
)
from mmm_orch.version import __version__

MAX_COMMAND_WORDS = 4096


def resolve(request: Request) -> Plan:
    """The plan for `request`, or MmmError naming the field, the value and what is allowed."""
    machine = load_machine(request.machine)
    workload = load_workload(request.workload)
    checks.check_script_text(machine, workload)
    _check_command(workload, request.command)
    override = workload.machines.get(machine.name)

    nodes = launch_layout.node_count(machine, workload, override, request)
    walltime = queue_choice.walltime(machine, workload, override, request)
    launch_layout.check_devices(machine, workload)
    placement = launch_layout.placement(machine, request, nodes)
    account = queue_choice.account_for(machine, request)
    queue, tier, reason = queue_choice.pick_queue(
        machine, request, account, nodes + placement.spare_nodes, walltime
    )
    name = workload.name if request.name is None else request.name
    if not JOB_NAME.match(name):
        raise fail(
            "--name", name, "start with a letter; letters, digits, '_', '.', '-'; at most 63"
        )

    args = _trainer_args(workload, override.args if override else {}, request.options)
    if request.init_from is not None:
        args["init_from"] = _init_from(workload, request.init_from)
    _check_required(workload, args)
    layout = launch_layout.layout(machine, workload, nodes, args, request.devices)
    profile = _profile(machine, workload, request, args, layout.ranks)
    python = sys.executable if machine.python == "auto" else machine.python
    # {cpu_bind} and {python} go into launcher lines: shell words, like the values around them.
    cpu_bind = machine.launcher.cpu_bind
    fields = {
        "nodes": nodes,
        "ranks": layout.ranks,
        "ranks_per_node": layout.ranks_per_node,
        "gpus_per_node": layout.gpus_per_node,
        "cpus_per_rank": layout.cpus_per_rank,
        "cpu_bind": shlex.quote(cpu_bind) if cpu_bind else "",
        "python": shlex.quote(python),
    }
    devices = launch_layout.devices(
        machine, layout.ranks_per_node, launch_layout.device_share(machine, request.devices, fields)
    )
    sized = memory.sized(machine, workload, args, layout)
    pretrained.check_before_queue(workload, args, request.workdir, machine.login_hosts)
    priced = cost.priced(
        machine,
        queue,
        nodes,
        placement.spare_nodes,
        walltime,
        cost.parse_budget(request.max_node_hours),
        len(devices.share.held) / len(devices.share.ids) if devices.share else 1.0,
    )
    cost.check_max("this job", priced.most, priced.budget, priced.unit)
    return Plan(
        mmm_orch_version=__version__,
        machine=machine.name,
        facility=machine.facility,
        scheduler=machine.scheduler.kind,
        scheduler_commands=dataclasses.asdict(machine.scheduler.commands),
        workload=workload.name,
        name=name,
        layout=layout,
        queue=QueuePlan(
            name=queue.name if queue else None,
            tier=tier,
            reason=reason,
            directives=queue_choice.queue_directives(machine, queue),
            walltime=walltime,
            account=account,
            resources=tuple(
                d.format(**{**fields, "nodes": nodes + placement.spare_nodes})
                for d in machine.directives
            ),
            submit_dir_var=machine.scheduler.submit_dir_var,
        ),
        devices=devices,
        environment=environment.job_environment(
            machine, workload, override, request, nodes, devices, python, account
        ),
        launch=launch_layout.launch(
            machine, workload, request, fields, python, args, devices.share, profile
        ),
        guard=Guard(
            first_step_timeout=workload.watchdog.first_step_timeout
            if workload.watchdog.enabled
            else 0,
            step_timeout=workload.watchdog.step_timeout if workload.watchdog.enabled else 0,
            walltime_margin=min(workload.watchdog.walltime_margin, walltime // 3),
            progress=workload.watchdog.progress,
            screen=_screen(machine, request, nodes + placement.spare_nodes, fields),
            stragglers=_stragglers(machine, workload, request, nodes, placement.spare_nodes),
        ),
        placement=placement,
        transport=Transport(
            login_hosts=tuple(machine.login_hosts), remote_jobs_dir=machine.remote_jobs_dir
        ),
        memory=sized,
        cost=priced,
    )


def _screen(
    machine: Machine, request: Request, allocated: int, fields: dict[str, Any]
) -> Screen | None:
    """The screen before the launch of a job on `allocated` nodes (spares too): by --screen or
    the profile's default, for a job of more than one node whose launcher can run a command on
    each (launcher.per_node); not for a run on some devices of one node."""
    mode = request.screen or machine.screen.default
    if mode not in ("stop", "warn", "off"):
        raise fail("--screen", mode, "stop, warn or off")
    if mode == "off" or allocated < 2 or not machine.launcher.per_node or request.devices:
        return None
    node = machine.node
    device = "cpu" if not node.gpus else {"rocm": "cuda"}.get(node.device, node.device)
    return Screen(
        on_fail=mode,
        seconds=machine.screen.seconds,
        of_median=machine.screen.of_median,
        of_peak=machine.screen.of_peak,
        peak_gflops=node.peak_tflops * 1000 if node.peak_tflops and device != "cpu" else None,
        device=device,
        devices=node.gpus if device != "cpu" else 0,
        per_node=machine.launcher.per_node.format(**{**fields, "nodes": allocated}),
        host_addr=machine.rendezvous.host_addr,
    )


def _stragglers(
    machine: Machine, workload: Workload, request: Request, nodes: int, spares: int
) -> Stragglers | None:
    """The straggler watch of a trainer's run on more than one node: name (the default), leave
    (it needs a spare to take the node's place) or off."""
    action = request.stragglers or "name"
    if action not in ("name", "leave", "off"):
        raise fail("--stragglers", action, "name, leave or off")
    if action == "leave" and not spares:
        raise fail("--stragglers", action, "with --spare-nodes K: a spare takes the node's place")
    if action == "off" or nodes < 2 or not workload.trainer:
        return None
    settings = machine.screen
    return Stragglers(
        settings.straggler_every, settings.straggler_checks, settings.of_median, action
    )


def _check_command(workload: Workload, command: tuple[str, ...]) -> None:
    """The user's own program runs where a trainer would: only for a workload without one."""
    if workload.trainer and command:
        raise fail(
            "command after --",
            " ".join(command)[:200],
            f"workload {workload.name} runs "
            f"its trainer ({workload.trainer}); leave the workload out (or name one "
            "without a trainer, such as `command`) to run your own",
        )
    if not workload.trainer and not command:
        raise fail(
            "workload",
            workload.name,
            "it runs your own program: give it after --, e.g. `-- python3 -m mypkg.train`",
        )
    if len(command) > MAX_COMMAND_WORDS:
        raise fail("command after --", f"{len(command)} words", f"at most {MAX_COMMAND_WORDS}")
    for i, word in enumerate(command):
        checks.check_text(f"command word {i + 1}", word)
    if command and not command[0].strip():
        raise fail("command after --", command[0], "it starts with the program to run")


def _trainer_args(
    workload: Workload, machine_args: dict[str, Any], given: tuple[tuple[str, Any], ...]
) -> dict[str, Any]:
    """The trainer's options: the layout's defaults, the spec's args, the machine's, then those
    given (--set, the API's options), each read as its option's type."""
    args: dict[str, Any] = {
        key: workload.options[key].coerce(key, workload.options[key].default)
        for key in LAYOUT_OPTIONS
        if key in workload.options and workload.options[key].default is not None
    }
    for source in (workload.args, machine_args):
        for key, value in source.items():
            args[key] = workload.options[key].coerce(key, value)
    for key, value in given:
        option = workload.options.get(key)
        if option is None:
            raise unknown_name(
                f"--set key for workload {workload.name}", key, sorted(workload.options)
            )
        try:
            args[key] = option.coerce(key, value)
        except ValueError as exc:
            raise InvalidValue(f"--set {key}", value, option.allowed(), f"--set {exc}") from None
    return args


def _init_from(workload: Workload, path: str) -> str:
    option = workload.options.get("init_from")
    if option is None:
        takers = "; those that do have an init_from option (`mmm-orch workloads`)"
        raise fail("--init-from", path, f"workload {workload.name} starts from no weights{takers}")
    try:
        return str(option.coerce("init_from", path))
    except ValueError:
        raise fail("--init-from", path, option.allowed()) from None


def _profile(
    machine: Machine, workload: Workload, request: Request, args: dict[str, Any], ranks: int
) -> ProfilePlan | None:
    """How the run is profiled (--profile, or the workload's `profile` option): torch, or one of
    the machine's profilers; its window inside the run's steps (where the workload counts them)
    and its ranks ones the run has, before the queue: the program would refuse them after the
    wait. A trainer is told by its options, your command by the job's MMM_ORCH_PROFILE*."""
    option = workload.options.get("profile")
    if request.profile is not None:
        if option is None and workload.trainer:
            takers = "; the training workloads do (`mmm-orch workloads`)"
            raise fail(
                "--profile", request.profile, f"workload {workload.name} has no steps{takers}"
            )
        if option is not None:
            set_too = args.get("profile", request.profile)
            if set_too != request.profile:
                raise fail("--profile", request.profile, f"one tool: --set profile={set_too} too")
            args["profile"] = request.profile

    def given(name: str) -> Any:
        known = workload.options.get(name)
        return args.get(name, known.default if known else None)

    last_step = given("steps")
    if option is not None:
        tool, steps, chosen = given("profile"), given("profile_steps"), given("profile_ranks")
    else:
        env = dict(request.env)
        tool = request.profile or env.get(protocol.PROFILE_VAR, "off")
        steps, chosen = (
            env.get(protocol.PROFILE_STEPS_VAR, ""),
            env.get(protocol.PROFILE_RANKS_VAR, ""),
        )
    if tool in (None, "off"):
        return None
    profiler = machine.profilers.get(tool)
    if tool != "torch" and profiler is None:
        raise fail(
            "--profile",
            tool,
            f"{machine.name} has {', '.join(['off', 'torch', *machine.profilers])}",
        )
    try:
        if isinstance(last_step, int):
            windows.window(steps or "", last_step)
        windows.ranks(chosen or "", ranks)
    except ValueError as exc:
        raise MmmError(str(exc)) from None
    if profiler is None:
        return ProfilePlan(tool=tool, ranks=chosen or "")
    return ProfilePlan(
        tool=tool,
        ranks=chosen or "",
        description=profiler.description,
        command=tuple(profiler.command),
        window=profiler.window,
        setup=tuple(profiler.setup),
        source=profiler.source,
    )


def _check_required(workload: Workload, args: dict[str, Any]) -> None:
    """A required option left empty, --init-from's first (what the other options go with)."""
    for name in sorted(workload.options, key=lambda name: name != "init_from"):
        option = workload.options[name]
        if option.required and args.get(name) in (None, ""):
            flag = "--init-from PATH" if name == "init_from" else f"--set {name}=..."
            raise fail(name, "", f"workload {workload.name} needs it ({flag}): {option.help}")
