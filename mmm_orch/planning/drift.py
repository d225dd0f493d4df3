"""`mmm-orch machines check`: where a machine profile's queues differ from the scheduler's live
configuration (queues missing or extra, node and walltime bounds, job limits, routing tiers).
Pure: the live queues come from the scheduler modules' parsers (schedulers/*_parse.py).

PBS queues are compared by name; a routing queue's destinations are the profile's tiers. A Slurm
queue is the partition and the QOS its directives name (`--partition=`/`-p`, `--qos=`/`-q`);
its bounds are the partition's (the QOS's where it sets them), its limits the QOS's and the
partition QOS's. Where the server sets no bound, there is nothing to differ from; where it
states one that cannot be read (not a number, a walltime, a list of limits as the scheduler
writes them), that is a difference of its own: the check never says "match" over it. Names come
from the scheduler: each is shown escaped (a line break or a terminal escape in one would forge
or hide a line of the answer)."""

from __future__ import annotations

from mmm_orch.config.machine import Machine
from mmm_orch.config.queues import Queue
from mmm_orch.errors import one_line
from mmm_orch.planning.resolve import queue_directives
from mmm_orch.schedulers.states import LiveQueue
from mmm_orch.walltime import format_walltime

_SLURM_FLAGS = {"-p": "partition", "--partition": "partition", "-q": "qos", "--qos": "qos"}


def differences(machine: Machine, live: list[LiveQueue]) -> list[str]:
    """Every difference between `machine`'s queues and `live`, one line each (a queue, partition
    or QOS two of the profile's queues share is said once)."""
    found = _slurm(machine, live) if machine.scheduler.kind == "slurm" else _pbs(machine, live)
    return list(dict.fromkeys(found))


def _pbs(machine: Machine, live: list[LiveQueue]) -> list[str]:
    found = {queue.name: queue for queue in live}
    out, tiers = [], set()
    for queue in machine.queues:
        where = f"queue {one_line(queue.name)}"
        server = found.get(queue.name)
        if server is None:
            out.append(f"{where}: in the profile, not on the server")
            continue
        named = [tier.name for tier in queue.tiers if tier.name]
        tiers.update(named)
        out += _unreadable("queue", server)
        if _whole_unreadable(server):
            continue
        out += _bounds(where, queue.min_nodes, queue.max_nodes, queue.max_walltime, server)
        out += _limits(where, queue, server.limits)
        if server.kind == "route" or named:
            if sorted(server.destinations) != sorted(named):
                out.append(
                    f"{where}: the server routes to "
                    f"{_names(server.destinations) or 'nothing'}; the profile's tiers "
                    f"are {_names(named) or 'none'}"
                )
            for tier in queue.tiers:
                if tier.name in found:
                    out += _unreadable("queue", found[tier.name])
                    out += _bounds(
                        f"{where} tier {one_line(tier.name)}",
                        tier.min_nodes,
                        tier.max_nodes,
                        tier.max_walltime,
                        found[tier.name],
                    )
    listed = {queue.name for queue in machine.queues} | tiers
    out += [
        f"queue {one_line(name)}: on the server, not in the profile"
        for name in found
        if name not in listed
    ]
    return out


def _slurm(machine: Machine, live: list[LiveQueue]) -> list[str]:
    partitions = {q.name: q for q in live if q.kind == "partition"}
    qos = {q.name: q for q in live if q.kind == "qos"}
    out, used = [], set()
    for queue in machine.queues:
        names = slurm_names(queue_directives(machine, queue))
        where = f"queue {one_line(queue.name)}"
        partition = names.get("partition")
        if partition is not None:
            used.add(partition)
            if partition not in partitions:
                out.append(f"{where}: partition {one_line(partition)} is not on the server")
                continue
        wanted = [
            n
            for n in (
                names.get("qos"),
                partitions[partition].destinations[0]
                if partition and partitions[partition].destinations
                else None,
            )
            if n
        ]
        missing = [n for n in wanted if n not in qos]
        if missing:
            out.append(f"{where}: QOS {_names(missing)} not on the server")
            continue
        if partition is not None:
            out += _unreadable("partition", partitions[partition])
        for name in wanted:
            out += _unreadable("QOS", qos[name])
        server = _merged(partitions.get(partition or ""), [qos[n] for n in wanted])
        out += _bounds(where, queue.min_nodes, queue.max_nodes, queue.max_walltime, server)
        out += _limits(where, queue, server.limits)
    out += [
        f"partition {one_line(name)}: on the server, not in the profile"
        for name in partitions
        if name not in used
    ]
    return out


def slurm_names(directives: tuple[str, ...]) -> dict[str, str]:
    """The partition and QOS that a queue's Slurm directives name."""
    words = [w for d in directives for w in d.split()]
    names = {}
    for i, word in enumerate(words):
        flag, eq, value = word.partition("=")
        if flag in _SLURM_FLAGS:
            value = value if eq else (words[i + 1] if i + 1 < len(words) else "")
            if value:
                names[_SLURM_FLAGS[flag]] = value
    return names


def _merged(partition: LiveQueue | None, qos: list[LiveQueue]) -> LiveQueue:
    """A partition with its QOS over it: the QOS's bounds where they set one, all limits."""
    parts = [q for q in (partition, *qos) if q is not None]

    def last(attribute: str):
        return next(
            (getattr(q, attribute) for q in reversed(parts) if getattr(q, attribute) is not None),
            None,
        )

    return LiveQueue(
        name=parts[0].name,
        kind="merged",
        min_nodes=last("min_nodes"),
        max_nodes=last("max_nodes"),
        max_walltime=last("max_walltime"),
        limits=None
        if any(q.limits is None for q in parts)
        else frozenset().union(*(q.limits for q in parts if q.limits is not None)),
    )


def _bounds(where: str, low: int, high: int, walltime: int, server: LiveQueue) -> list[str]:
    out = []
    if server.min_nodes is not None and server.min_nodes != low:
        out.append(f"{where}: min_nodes {low} in the profile, {server.min_nodes} on the server")
    if server.max_nodes is not None and server.max_nodes != high:
        out.append(f"{where}: max_nodes {high} in the profile, {server.max_nodes} on the server")
    if server.max_walltime is not None and server.max_walltime != walltime:
        out.append(
            f"{where}: max_walltime {format_walltime(walltime)} in the profile, "
            f"{format_walltime(server.max_walltime)} on the server"
        )
    return out


def _limits(where: str, queue: Queue, server: frozenset[tuple[int, str, str]] | None) -> list[str]:
    if server is None:  # one could not be read: said by _unreadable
        return []
    profile = {(limit.jobs, limit.per, limit.counts): limit for limit in queue.job_limits}
    out = [
        f"{where}: job limit {limit.words()} in the profile, not on the server"
        for key, limit in profile.items()
        if key not in server
    ]
    for jobs, per, counts in sorted(server - set(profile)):
        out.append(
            f"{where}: job limit of {jobs} ({counts}, per {per}) on the server, not in the profile"
        )
    return out


def _unreadable(kind: str, server: LiveQueue) -> list[str]:
    """What the scheduler states of `server` that could not be read: `kind name.field: value`."""
    name = one_line(server.name)
    return [
        f"could not read {kind} {name}{'.' + field if field else ''}: {value}"
        for field, value in server.unreadable
    ]


def _whole_unreadable(server: LiveQueue) -> bool:
    return any(field == "" for field, _ in server.unreadable)


def _names(names: list[str] | tuple[str, ...]) -> str:
    return ", ".join(one_line(name) for name in names)
