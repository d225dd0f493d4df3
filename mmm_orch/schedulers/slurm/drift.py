"""Where a profile's queues differ from a Slurm cluster's (scontrol's partitions, sacctmgr's
QOS): a queue is the partition and the QOS its directives name (`--partition=`/`-p`,
`--qos=`/`-q`); its bounds are the partition's (the QOS's where it sets them), its limits the
QOS's and the partition QOS's."""

from __future__ import annotations

from collections.abc import Sequence

from mmm_orch.errors import one_line
from mmm_orch.schedulers.drift import ProfileQueue, bounds, limits, names, unreadable
from mmm_orch.schedulers.states import LiveQueue

_FLAGS = {"-p": "partition", "--partition": "partition", "-q": "qos", "--qos": "qos"}


def differences(queues: Sequence[ProfileQueue], live: list[LiveQueue]) -> list[str]:
    partitions = {q.name: q for q in live if q.kind == "partition"}
    qos = {q.name: q for q in live if q.kind == "qos"}
    out, used = [], set()
    for profile in queues:
        queue = profile.queue
        named = slurm_names(profile.directives)
        where = f"queue {one_line(queue.name)}"
        partition = named.get("partition")
        if partition is not None:
            used.add(partition)
            if partition not in partitions:
                out.append(f"{where}: partition {one_line(partition)} is not on the server")
                continue
        wanted = [
            n
            for n in (
                named.get("qos"),
                partitions[partition].destinations[0]
                if partition and partitions[partition].destinations
                else None,
            )
            if n
        ]
        missing = [n for n in wanted if n not in qos]
        if missing:
            out.append(f"{where}: QOS {names(missing)} not on the server")
            continue
        if partition is not None:
            out += unreadable("partition", partitions[partition])
        for name in wanted:
            out += unreadable("QOS", qos[name])
        server = _merged(partitions.get(partition or ""), [qos[n] for n in wanted])
        out += bounds(where, queue, server)
        out += limits(where, queue, server.limits)
    out += [
        f"partition {one_line(name)}: on the server, not in the profile"
        for name in partitions
        if name not in used
    ]
    return out


def slurm_names(directives: tuple[str, ...]) -> dict[str, str]:
    """The partition and QOS that a queue's Slurm directives name."""
    words = [w for d in directives for w in d.split()]
    found = {}
    for i, word in enumerate(words):
        flag, eq, value = word.partition("=")
        if flag in _FLAGS:
            value = value if eq else (words[i + 1] if i + 1 < len(words) else "")
            if value:
                found[_FLAGS[flag]] = value
    return found


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
