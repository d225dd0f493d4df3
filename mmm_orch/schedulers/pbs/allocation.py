"""The PBS job this process runs in (`qsub -I`, or a batch script), from the variables PBS sets:
its id, its node file (a host a line, once per chunk or rank) and the ncpus of its chunks."""

from __future__ import annotations

from collections.abc import Mapping

from mmm_orch.errors import MmmError
from mmm_orch.paths import NotReadable, read_regular
from mmm_orch.schedulers.allocation import Allocation, cpus_said, ends_at, node_names

MAX_NODEFILE_BYTES = 64 << 20  # far above the largest: a line a rank of 10,000 nodes


def allocation(env: Mapping[str, str]) -> Allocation:
    nodefile = env.get("PBS_NODEFILE", "")
    return Allocation(
        "pbs",
        env["PBS_JOBID"],
        tuple(node_names(_node_file(nodefile) if nodefile else "", f"PBS_NODEFILE {nodefile!r}")),
        *cpus_said("NCPUS", env.get("NCPUS", "")),  # the ncpus of the job's chunks (one a node)
        ends_at(env),
    )


def _node_file(path: str) -> str:
    """The node file's text: a regular file of bounded size in UTF-8 (a FIFO or a device put
    there is refused unread, not waited on)."""
    try:
        data = read_regular(path, MAX_NODEFILE_BYTES)
    except NotReadable as exc:
        raise MmmError(f"PBS_NODEFILE: {exc}") from None
    except OSError as exc:
        raise MmmError(f"PBS_NODEFILE {path!r}: cannot read: {exc.strerror}") from None
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise MmmError(
            f"PBS_NODEFILE {path!r}: not UTF-8 text (byte {exc.start}); a node file "
            "names one host a line"
        ) from None
