"""Resolve a request (machine, workload, CLI options) into one validated, immutable plan, one
section at a time: layout, queue, launch, devices, environment, guard, placement.

Data flows one way: Request -> Plan -> script -> submission -> record. Every failure is an
MmmError naming the field, the value and what is allowed, raised before anything is written.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from typing import Any

from mmm_orch.config.common import NODE_NAME
from mmm_orch.config.machine import Machine
from mmm_orch.config.queues import Queue
from mmm_orch.config.registry import load_machine, load_workload, unknown_name
from mmm_orch.config.workload import LAYOUT_OPTIONS, MachineOverride, Workload
from mmm_orch.errors import InvalidValue, MmmError, QueueFull
from mmm_orch.injob import protocol, windows
from mmm_orch.injob.protocol import MODULES
from mmm_orch.planning import checks, cost, memory, pretrained
from mmm_orch.planning.checks import JOB_NAME, SAFE_WORD, fail
from mmm_orch.planning.environment import check_built_on, env_groups, environment_word
from mmm_orch.planning.model import (
    COMMAND_OPTIONS,
    RESUMABLE_COMMAND_OPTIONS,
    SHARE_GROUP,
    Devices,
    DeviceShare,
    EnvEntry,
    EnvGroup,
    Environment,
    Guard,
    Launch,
    Layout,
    Placement,
    Plan,
    ProfilePlan,
    QueuePlan,
    Request,
    Transport,
)
from mmm_orch.planning.occupancy import NOTHING_YET, QueueLoad, past_limit, way_out
from mmm_orch.version import __version__
from mmm_orch.walltime import format_walltime, parse_walltime

MAX_COMMAND_WORDS = 4096


def resolve(request: Request) -> Plan:
    """The plan for `request`, or MmmError naming the field, the value and what is allowed."""
    machine = load_machine(request.machine)
    workload = load_workload(request.workload)
    checks.check_script_text(machine, workload)
    _check_command(workload, request.command)
    override = workload.machines.get(machine.name)

    nodes = _nodes(machine, workload, override, request)
    walltime = _walltime(machine, workload, override, request)
    _check_devices(machine, workload)
    placement = _placement(machine, request, nodes)
    account = account_for(machine, request)
    queue, tier, reason = _pick_queue(
        machine, request, account, nodes + placement.spare_nodes, walltime
    )
    name = workload.name if request.name is None else request.name
    if not JOB_NAME.match(name):
        raise fail(
            "--name", name, "start with a letter; letters, digits, '_', '.', '-'; at most 63"
        )

    args = _trainer_args(
        workload, override.args if override else {}, checks.pairs(request.sets, "--set")
    )
    if request.init_from is not None:
        args["init_from"] = _init_from(workload, request.init_from)
    _check_required(workload, args)
    layout = _layout(machine, workload, nodes, args, request.devices)
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
    devices = _devices(machine, layout.ranks_per_node, _share(machine, request.devices, fields))
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
            directives=queue_directives(machine, queue),
            walltime=walltime,
            account=account,
            resources=tuple(
                d.format(**{**fields, "nodes": nodes + placement.spare_nodes})
                for d in machine.directives
            ),
            submit_dir_var=machine.scheduler.submit_dir_var,
        ),
        devices=devices,
        environment=_environment(
            machine, workload, override, request, nodes, devices, python, account
        ),
        launch=_launch(machine, workload, request, fields, python, args, devices.share, profile),
        guard=Guard(
            first_step_timeout=workload.watchdog.first_step_timeout
            if workload.watchdog.enabled
            else 0,
            step_timeout=workload.watchdog.step_timeout if workload.watchdog.enabled else 0,
            walltime_margin=min(workload.watchdog.walltime_margin, walltime // 3),
            progress=workload.watchdog.progress,
        ),
        placement=placement,
        transport=Transport(
            login_hosts=tuple(machine.login_hosts), remote_jobs_dir=machine.remote_jobs_dir
        ),
        memory=sized,
        cost=priced,
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


def _nodes(
    machine: Machine, workload: Workload, override: MachineOverride | None, request: Request
) -> int:
    if request.devices is not None:
        return _nodes_of_a_share(machine, request, request.devices)
    nodes = request.nodes
    if nodes is None:
        nodes = (override and override.nodes) or min(workload.defaults.nodes, machine.max_nodes)
    if nodes < 1:
        raise fail("--nodes", nodes, "must be at least 1")
    if nodes > machine.max_nodes:
        raise fail("--nodes", nodes, f"{machine.name} has at most {machine.max_nodes} nodes")
    return nodes


def _nodes_of_a_share(machine: Machine, request: Request, devices: int) -> int:
    """A run on `devices` devices of one node: the profile says how a node is shared."""
    slots = machine.devices.slots
    if slots is None:
        raise fail(
            "--devices",
            devices,
            f"a machine whose profile says how runs share "
            f"a node's devices (devices.slots); {machine.name}'s does not",
        )
    if not 1 <= devices <= len(slots.ids):
        raise fail(
            "--devices",
            devices,
            f"1 to the {len(slots.ids)} devices of a "
            f"{machine.name} node (a larger run takes whole nodes: --nodes)",
        )
    if request.nodes not in (None, 1):
        raise fail("--nodes", request.nodes, "1 with --devices (a run on some devices of one node)")
    return 1


def _share(machine: Machine, devices: int | None, fields: dict[str, Any]) -> DeviceShare | None:
    """The first `devices` devices of a node, as the profile shares one (placement moves a run
    to others: Plan.on_devices)."""
    slots = machine.devices.slots
    if devices is None or slots is None:
        return None
    command = machine.launcher.command.format(**fields)
    return DeviceShare(
        held=tuple(range(devices)),
        ids=tuple(slots.ids),
        cpus=tuple(slots.cpus),
        cpus_joined_by=slots.cpus_joined_by,
        launcher=(command, *(arg.format(**fields, cpus="{cpus}") for arg in slots.launcher_args)),
        set=tuple(slots.set.items()),
    )


def _walltime(
    machine: Machine, workload: Workload, override: MachineOverride | None, request: Request
) -> int:
    if request.walltime is not None:
        try:
            walltime = parse_walltime(request.walltime)
        except ValueError as exc:
            raise InvalidValue(
                "--walltime", request.walltime, str(exc), f"--walltime: {exc}"
            ) from None
    else:
        walltime = (override and override.walltime) or workload.defaults.walltime
    if machine.min_walltime and walltime < machine.min_walltime:
        raise fail(
            "--walltime",
            format_walltime(walltime),
            f"{machine.name} needs at least {format_walltime(machine.min_walltime)}",
        )
    return walltime


def _check_devices(machine: Machine, workload: Workload) -> None:
    if workload.resources.accelerator and machine.node.gpus == 0:
        raise MmmError(
            f"workload {workload.name} needs an accelerator and {machine.name} has none "
            f"(device {machine.node.device})"
        )
    need = workload.resources.min_gpu_memory_gib
    have = machine.node.gpu_memory_gib
    if need and have and have < need:
        raise MmmError(
            f"workload {workload.name} needs {need} GiB per device; {machine.name} has {have} GiB"
        )


def _placement(machine: Machine, request: Request, nodes: int) -> Placement:
    spare = request.spare_nodes
    if spare < 0:
        raise fail("--spare-nodes", spare, "0 or more")
    if spare and not machine.launcher.on_nodes:
        raise fail(
            "--spare-nodes",
            spare,
            f"{machine.name}'s launcher cannot run on some of the "
            "job's nodes (its profile has no launcher.on_nodes)",
        )
    if nodes + spare > machine.max_nodes:
        raise fail(
            "--spare-nodes",
            spare,
            f"{nodes} + {spare} nodes: {machine.name} has at most {machine.max_nodes}",
        )
    allocated = nodes + spare
    avoid = request.avoid_nodes
    for node in avoid:  # from the database; they reach directives
        if not NODE_NAME.match(node):
            raise fail("bad node", node, "a host name; `mmm-orch nodes forget NODE` drops it")
    exclude = machine.scheduler.exclude_directive
    if exclude and avoid and allocated > machine.max_nodes - len(avoid):
        raise fail(
            "--nodes",
            nodes,
            f"{allocated} nodes with the spares: {machine.name} has "
            f"{machine.max_nodes}, less the known-bad {', '.join(avoid)} "
            f"(`mmm-orch nodes forget NODE` to use one again)",
        )
    return Placement(
        spare_nodes=spare,
        avoid_nodes=tuple(avoid),
        node_list=machine.scheduler.node_list,
        on_nodes=machine.launcher.on_nodes,
        host_addr=machine.rendezvous.host_addr,
        exclude_directive=exclude.format(nodes=",".join(avoid)) if exclude and avoid else "",
        failover_directives=tuple(machine.scheduler.failover_directives) if spare else (),
    )


def _pick_queue(machine: Machine, request: Request, account: str | None, nodes: int, walltime: int):
    """(queue, tier name, reason) for the request, or an error that names the limits. With the
    jobs the user already has (request.queue_load), a queue the request would fill past a job
    limit is skipped (named in the reason), or refused when asked for by name."""
    if not machine.queues:
        if request.queue:
            raise fail("--queue", request.queue, f"{machine.name} has no queues")
        return None, None, "no scheduler queue on this machine"
    load = request.queue_load or NOTHING_YET
    if request.queue:
        queue = machine.queue(request.queue)
        if queue is None:
            raise unknown_name(
                f"queue on {machine.name}", request.queue, [q.name for q in machine.queues]
            )
        ok, tier, why = _fits(queue, nodes, walltime)
        if not ok:
            raise MmmError(
                f"--queue {queue.name!r} cannot run {nodes} nodes for {format_walltime(walltime)}: "
                f"it {why} ({queue.limits()})"
            )
        full = past_limit(
            machine, queue, queue_directives(machine, queue), load, account, request.jobs
        )
        if full:
            room = queues_with_room(machine, nodes, walltime, load, account, request.jobs)
            raise QueueFull(f"--queue {queue.name!r} is full for you: {full}. {way_out(room)}")
        return queue, tier, "requested"
    tried, skipped = [], []
    for queue in machine.queues:
        if not queue.automatic or queue.by_request:
            continue
        ok, tier, why = _fits(queue, nodes, walltime)
        if not ok:
            tried.append(f"{queue.name} ({queue.limits()})")
            continue
        full = past_limit(
            machine, queue, queue_directives(machine, queue), load, account, request.jobs
        )
        if full:
            skipped.append(full)
            continue
        reason = "first queue that fits nodes and walltime"
        if skipped:
            reason = f"{reason} and the job limits (skipped: {'; '.join(skipped)})"
        return queue, tier, reason
    if skipped:
        room = queues_with_room(machine, nodes, walltime, load, account, request.jobs)
        raise QueueFull(
            f"no queue on {machine.name} that is picked without --queue can take "
            f"{request.jobs} more job{'s' if request.jobs > 1 else ''} of {nodes} "
            f"nodes for {format_walltime(walltime)}: {'; '.join(skipped)}. "
            f"{way_out(room)}"
        )
    raise MmmError(
        f"no queue on {machine.name} fits {nodes} nodes for {format_walltime(walltime)}; "
        f"automatic queues: {'; '.join(tried)}. Change --nodes/--walltime or name a --queue"
    )


def queues_with_room(
    machine: Machine, nodes: int, walltime: int, load: QueueLoad, account: str | None, jobs: int
) -> list[str]:
    """The queues (those picked only by name too) that fit `nodes` for `walltime` and have room
    for `jobs` more of the user's jobs."""
    ordered = sorted(machine.queues, key=lambda queue: not queue.automatic)
    return [
        queue.name
        for queue in ordered
        if not queue.by_request
        and _fits(queue, nodes, walltime)[0]
        and not past_limit(machine, queue, queue_directives(machine, queue), load, account, jobs)
    ]


def _fits(queue: Queue, nodes: int, walltime: int) -> tuple[bool, str | None, str]:
    """(fits, tier name, why not) of `queue` for `nodes` nodes and `walltime` seconds."""
    if not queue.min_nodes <= nodes <= queue.max_nodes:
        return False, None, f"takes {queue.min_nodes}-{queue.max_nodes} nodes"
    if queue.tiers:
        tier = next((t for t in queue.tiers if t.min_nodes <= nodes <= t.max_nodes), None)
        if tier is None:
            return False, None, "no tier for this node count"
        if walltime > tier.max_walltime:
            label = f"tier {tier.name}" if tier.name else f"{tier.min_nodes}-{tier.max_nodes} nodes"
            return (
                False,
                tier.name or None,
                (f"allows at most {format_walltime(tier.max_walltime)} for {label}"),
            )
        return True, tier.name or None, ""
    if walltime > queue.max_walltime:
        return False, None, f"allows at most {format_walltime(queue.max_walltime)}"
    return True, None, ""


def queue_directives(machine: Machine, queue: Queue | None) -> tuple[str, ...]:
    if queue is None:
        return ()
    templates = (
        queue.directives if queue.directives is not None else [machine.scheduler.queue_directive]
    )
    return tuple(t.format(queue=queue.name) for t in templates if t)


def account_for(machine: Machine, request: Request) -> str | None:
    account = (
        request.account or os.environ.get("MMM_ORCH_ACCOUNT") or machine.account.default or None
    )
    if machine.account.required and not account:
        raise MmmError(f"--account is required on {machine.name} (or set MMM_ORCH_ACCOUNT)")
    if account and not SAFE_WORD.match(account):
        raise fail("--account", account, "use letters, digits, '_', '.', '+', '-'")
    return account


def _trainer_args(workload: Workload, machine_args: dict[str, Any], sets) -> dict[str, Any]:
    args: dict[str, Any] = {
        key: workload.options[key].coerce(key, workload.options[key].default)
        for key in LAYOUT_OPTIONS
        if key in workload.options and workload.options[key].default is not None
    }
    for source in (workload.args, machine_args):
        for key, value in source.items():
            args[key] = workload.options[key].coerce(key, value)
    for key, value in sets:
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
        env = dict(checks.pairs(request.envs, "--env"))
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


def _layout(
    machine: Machine, workload: Workload, nodes: int, args: dict[str, Any], devices: int | None
) -> Layout:
    """One rank per device (or the profile's ranks per node); on some devices of a node, one
    rank each, with the CPUs of its device."""
    ranks_per_node = devices or machine.default_ranks_per_node
    ranks = nodes * ranks_per_node
    tp = workload.layout_value("tp", args)
    pp = workload.layout_value("pp", args)
    cp = workload.layout_value("cp", args)
    if tp < 1 or ranks_per_node % tp:
        raise fail(
            "tp",
            tp,
            f"must divide the {ranks_per_node} ranks per node on {machine.name} "
            "(tensor-parallel groups stay inside a node)",
        )
    if pp < 1 or ranks % (tp * pp):
        raise fail("pp", pp, f"tp x pp = {tp * pp} must divide the {ranks} ranks")
    if cp < 1 or ranks % (tp * pp * cp):
        raise fail("cp", cp, f"tp x pp x cp = {tp * pp * cp} must divide the {ranks} ranks")
    sharing = len(machine.devices.slots.ids) if devices and machine.devices.slots else None
    cpus_per_rank = max(
        1, machine.node.usable_cores * machine.node.threads_per_core // (sharing or ranks_per_node)
    )
    return Layout(
        nodes=nodes,
        ranks_per_node=ranks_per_node,
        ranks=ranks,
        gpus_per_node=machine.node.gpus,
        cpus_per_rank=cpus_per_rank,
        mesh={"dp": ranks // (tp * pp * cp), "tp": tp, "pp": pp, "cp": cp},
    )


def _devices(machine: Machine, ranks_per_node: int, share: DeviceShare | None) -> Devices:
    gpus = machine.node.gpus
    return Devices(
        kind=machine.node.device,
        torch="cuda" if machine.node.device == "rocm" else machine.node.device,
        backend=machine.backend,
        index=tuple(machine.devices.index_for(r, gpus) for r in range(ranks_per_node)),
        # on a share, the mask (or the launcher) decides which devices a rank sees
        physical=tuple(
            None if share else machine.devices.physical_for(r, gpus) for r in range(ranks_per_node)
        ),
        share=share,
    )


def _environment(
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


def _launch(
    machine: Machine,
    workload: Workload,
    request: Request,
    fields: dict[str, Any],
    python: str,
    args: dict[str, Any],
    share: DeviceShare | None,
    profile: ProfilePlan | None,
) -> Launch:
    launcher = [machine.launcher.command.format(**fields)]
    launcher += [arg.format(**fields) for arg in machine.launcher.args]
    return Launch(
        launcher=share.launcher_words if share else tuple(launcher),
        hosts=machine.launcher.hosts,
        per_node=machine.launcher.per_node.format(**fields),
        python=python,
        python_is_submitters=machine.python == "auto",
        python_prefix=machine.launcher.python_prefix,
        trainer=workload.trainer,
        args=args,
        options=tuple(workload.options)
        if workload.trainer
        else RESUMABLE_COMMAND_OPTIONS
        if workload.resumable
        else COMMAND_OPTIONS,
        stop_signal=machine.launcher.stop_signal,
        workdir=checks.workdir(request.workdir),
        workdir_given=request.workdir is not None,
        command=(*machine.launcher.command_prefix, *request.command) if request.command else (),
        start_gap=machine.launcher.start_gap,
        profile=profile,
    )
