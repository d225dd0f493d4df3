"""The rendezvous port: one no other job or attempt holds, and a refused bind retried.

A fixed port per job (20000 + job id, + 1 per failover attempt) collides on a shared node: one
job's second attempt takes the next job's port, and two schedulers' job N take the same one
(a shared QOS shares nodes too). So a profile may say `master_port: auto`: the job
script asks this host for a port nobody holds (`python -m mmm_orch.injob.rendezvous`), each relaunch
gets a fresh one, and a rendezvous that could still not bind (another process took the port in
between) is a launch fault: relaunched on a fresh port, never blamed on the code or a node.

Runs inside jobs: the standard library only.
"""

from __future__ import annotations

import re
import socket

# torch's TCPStore ("... name: EADDRINUSE, message: address already in use") and any other
# listener that reports errno 98.
PORT_IN_USE = re.compile(r"EADDRINUSE|[Aa]ddress already in use")
TRIES = 3  # launches on fresh ports before a refused bind is left to stand


def free_port() -> int:
    """A TCP port no socket on this host is bound to now (the kernel's choice)."""
    for family, address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind((address, 0))
                return probe.getsockname()[1]
        except OSError:
            continue
    raise OSError("no TCP port can be bound on this host")


if __name__ == "__main__":
    print(free_port())
