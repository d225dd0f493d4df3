"""How a plan's ranks are laid out and started: the node count (whole nodes, or some devices of
one), the spares and the nodes to avoid, the parallel mesh (tp, pp, cp within the ranks), which
devices each rank sees, and the launcher line that starts them."""

from __future__ import annotations

from typing import Any

from mmm_orch.config.machine import Machine
from mmm_orch.config.workload import MachineOverride, Workload
from mmm_orch.errors import MmmError
from mmm_orch.limits import NODE_NAME
from mmm_orch.planning import checks
from mmm_orch.planning.checks import fail
from mmm_orch.planning.model import (
    COMMAND_OPTIONS,
    RESUMABLE_COMMAND_OPTIONS,
    Devices,
    DeviceShare,
    Launch,
    Layout,
    Placement,
    ProfilePlan,
    Request,
)


def node_count(
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


def device_share(
    machine: Machine, devices: int | None, fields: dict[str, Any]
) -> DeviceShare | None:
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


def check_devices(machine: Machine, workload: Workload) -> None:
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


def placement(machine: Machine, request: Request, nodes: int) -> Placement:
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


def layout(
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


def devices(machine: Machine, ranks_per_node: int, share: DeviceShare | None) -> Devices:
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


def launch(
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
