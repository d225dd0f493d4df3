"""Where a profile's queues differ from a PBS server's (qstat -Q -f -F json): queues are compared
by name, and a routing queue's destinations are the profile's tiers."""

from __future__ import annotations

from collections.abc import Sequence

from mmm_orch.errors import one_line
from mmm_orch.schedulers.drift import (
    ProfileQueue,
    bounds,
    limits,
    names,
    unreadable,
    whole_unreadable,
)
from mmm_orch.schedulers.states import LiveQueue


def differences(queues: Sequence[ProfileQueue], live: list[LiveQueue]) -> list[str]:
    found = {queue.name: queue for queue in live}
    out, tiers = [], set()
    for queue in (profile.queue for profile in queues):
        where = f"queue {one_line(queue.name)}"
        server = found.get(queue.name)
        if server is None:
            out.append(f"{where}: in the profile, not on the server")
            continue
        named = [tier.name for tier in queue.tiers if tier.name]
        tiers.update(named)
        out += unreadable("queue", server)
        if whole_unreadable(server):
            continue
        out += bounds(where, queue, server)
        out += limits(where, queue, server.limits)
        if server.kind == "route" or named:
            if sorted(server.destinations) != sorted(named):
                out.append(
                    f"{where}: the server routes to "
                    f"{names(server.destinations) or 'nothing'}; the profile's tiers "
                    f"are {names(named) or 'none'}"
                )
            for tier in queue.tiers:
                if tier.name in found:
                    out += unreadable("queue", found[tier.name])
                    out += bounds(f"{where} tier {one_line(tier.name)}", tier, found[tier.name])
    listed = {profile.queue.name for profile in queues} | tiers
    out += [
        f"queue {one_line(name)}: on the server, not in the profile"
        for name in found
        if name not in listed
    ]
    return out
