"""How a job ended, as one of a few end classes: what mmm-orch reads to know it, what it does and
records, and what `rerun` does about it. The table is defined once here; `status`, `diagnose`,
the record (jobs.end_class, end_node, end_evidence), `rerun` and the manual's table
(docs/reference/exit-codes.md) all read it.

classify() takes what a refresh or a diagnosis has read of the ended job (its state, its outcome
file, its log's markers and first failure, its screen and failover files) and names the class,
the node it points at and the evidence. The standard library only: the job's own Python may
read it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mmm_orch.injob import files, protocol

# What `rerun JOB` does (without --resume or --fresh) after each class.
RESUME = "resume"  # from the run's latest checkpoint, or fresh where none was saved
FRESH = "fresh"  # from the start: nothing of this run is worth resuming
REFUSE = "refuse"  # the same plan would end the same way: say what to change first


@dataclass(frozen=True)
class EndClass:
    name: str
    what: str  # what happened
    read: str  # what mmm-orch reads to know it
    does: str  # what the job and mmm-orch do about it, and what they record
    rerun: str  # RESUME, FRESH or REFUSE
    avoid_node: bool = False  # the rerun's plan leaves out the node it points at


COMPLETED = EndClass(
    "completed",
    "the launch finished with exit 0",
    "the scheduler's success, and the outcome file's exit 0",
    "nothing more",
    FRESH,
)
WALLTIME = EndClass(
    "walltime",
    "the scheduler ended the job at its walltime, or the watchdog had the trainers save and "
    "stop just before it",
    "the scheduler's TIMEOUT (Slurm) or its walltime kill line (PBS: `job killed: walltime`); "
    "the outcome file's `checkpointed` (exit 75)",
    "the record says the checkpoint step a resume starts from",
    RESUME,
)
CRASH = EndClass(
    "crash",
    "a rank failed after training steps (an exception, CUDA out of memory, a collective's error)",
    "the job failed after its first step; diagnose's first failure names the rank and its line",
    "failover (with spares) stops: the code, not a node; the record keeps the first failure",
    RESUME,
)
NODE_LOST = EndClass(
    "node-lost",
    "a node lost its ranks (killed, unreachable, its device failed)",
    "a node-fault signature naming the node (srun `n2: tasks 2-3: Killed`, Hydra `RUNNING AT`, "
    "PALS `shepherd died from signal 9`, a GPU's Xid or ECC error), or failover's retired node",
    "failover swaps in a spare; the node goes into the bad-node memory (`mmm-orch nodes`)",
    RESUME,
    avoid_node=True,
)
HANG = EndClass(
    "hang",
    "no step completed for longer than the watchdog allows",
    "the watchdog's `hung:` line and exit 124 (the outcome file's `hung`)",
    "the watchdog stops the launch (the trainers save on its SIGTERM); failover retries on a "
    "spare; a node it names goes into the bad-node memory",
    RESUME,
    avoid_node=True,
)
DISK_FULL = EndClass(
    "disk-full",
    "a write failed for lack of room: the filesystem or the quota is full (on Lustre, one full "
    "OST is enough while `df` shows room)",
    "a full-filesystem signature (`No space left on device`, errno 28, `Disk quota exceeded`, "
    "errno 122, torch's `PytorchStreamWriter failed writing file`)",
    "the record names the line; the latest complete checkpoint is the one a resume reads",
    RESUME,
)
NO_FIRST_STEP = EndClass(
    "no-first-step",
    "the launch ended before its first training step (an import, a refusal, a rendezvous, a "
    "bad option)",
    "no `first_step=` line from the trainers; diagnose's first failure says why",
    "failover stops (a spare would fail the same way); nothing was saved",
    FRESH,
)
SETUP_FAILED = EndClass(
    "setup-failed",
    "a line of the stack's setup (a module load, the environment's activation) failed, before "
    "the launch",
    "the script's `setup_failed:` line and the module system's words above it",
    "`status` names the module and the check to run (`mmm-orch machines check MACHINE`)",
    REFUSE,
)
SCREENED_OUT = EndClass(
    "screened-out",
    "the screen at the job's start left out a slow node: a spare took its place, or the job "
    "stopped before its trainer",
    f"the screen's file ({protocol.SCREEN_FILE}) and exit {protocol.EXIT_SCREENED_OUT}",
    "the node and its figures go into the bad-node memory and the record (`status --json`)",
    RESUME,
    avoid_node=True,
)
STRAGGLER_LEFT = EndClass(
    "straggler-left",
    "the run saved and went on without a node whose ranks straggled (`--stragglers leave`)",
    f"failover's retired node of kind straggler ({protocol.FAILOVER_FILE}), from the trainers' "
    "`straggler: ... leaving NODE` line",
    "the node goes into the bad-node memory; the run goes on from its checkpoint on a spare",
    RESUME,
    avoid_node=True,
)
CANCELLED = EndClass(
    "cancelled",
    "the job was cancelled or deleted (mmm-orch cancel, scancel, qdel, a preemption), or a "
    "chain link did not run",
    "the scheduler's CANCELLED, the script's `stopped by SIGTERM` line, the outcome file's "
    "`stopped`, a cancel mmm-orch sent",
    "the trainers save on the SIGTERM",
    RESUME,
)
CLASSES = (
    COMPLETED,
    WALLTIME,
    CRASH,
    NODE_LOST,
    HANG,
    DISK_FULL,
    NO_FIRST_STEP,
    SETUP_FAILED,
    SCREENED_OUT,
    STRAGGLER_LEFT,
    CANCELLED,
)
BY_NAME = {c.name: c for c in CLASSES}
# The classes a failure signature may point at (a profile's `failures: [{end: ...}]`): those a
# log line alone can tell.
LOG_CLASSES = tuple(c.name for c in (CRASH, NODE_LOST, HANG, DISK_FULL, WALLTIME, SETUP_FAILED))


@dataclass(frozen=True)
class End:
    """A job's end class, the node it points at ('' none) and the evidence (a line, a file)."""

    name: str
    node: str = ""
    evidence: str = ""

    @property
    def end_class(self) -> EndClass:
        return BY_NAME[self.name]

    @property
    def said(self) -> str:
        """The class and its node, as status and diagnose print them: `node-lost n2`."""
        return f"{self.name} {self.node}".strip()

    def to_dict(self) -> dict[str, Any]:
        known = self.end_class
        return {
            "class": self.name,
            "node": self.node,
            "evidence": self.evidence,
            "what": known.what,
            "rerun": known.rerun,
            "rerun_avoids_node": known.avoid_node and bool(self.node),
        }


def rerun_words(end: End) -> str:
    """What `rerun JOB` does after `end`, in words."""
    known = end.end_class
    without = f", without {end.node}" if known.avoid_node and end.node else ""
    if known.rerun == REFUSE:
        return "refused: the same plan would stop at the same line (submit again once fixed)"
    if known.rerun == FRESH:
        return f"starts the run again from the beginning{without}"
    return f"resumes from the run's latest checkpoint (fresh where none was saved){without}"


@dataclass(frozen=True)
class Facts:
    """What was read of an ended job."""

    state: str  # JobState's value, after the job's own files were read
    reason: str = ""  # the state's reason, as status shows it
    why: str = ""  # the outcome file's (files.WHY_*), '' without one
    first_step: bool = False  # the trainers printed first_step=, or the launch a step=N
    setup_failed: str = ""  # the script's setup_failed line
    finding: Any = None  # injob.diagnose.Finding: the first failure in the log
    screened_out: tuple[Any, ...] = ()  # files.ScreenedNode the screen left out
    retired: tuple[Any, ...] = ()  # files.RetiredNode failover retired


def classify(facts: Facts) -> End:
    """The end class of an ended job: how it ended first (the scheduler's and the job's own
    word), then what its files and its log's first failure say, then whether it reached a step.
    A job that completed after a node was left out (a spare took its place) keeps the class of
    that node's end: completed, node-lost n2."""
    left = [n for n in facts.retired if n.kind == files.RETIRED_STRAGGLER]
    lost = [n for n in facts.retired if n.kind in (files.RETIRED_LOST, None) and not n.blind]
    screened = facts.screened_out
    finding = facts.finding
    line = finding.line if finding is not None else ""
    if facts.state == "completed":  # finished; without a node, where one was left out
        if left:
            return End(STRAGGLER_LEFT.name, left[-1].node, left[-1].evidence)
        if lost:
            return End(NODE_LOST.name, lost[-1].node, lost[-1].evidence)
        if screened:
            return End(SCREENED_OUT.name, screened[0].node, f"screened: {screened[0].why}")
        return End(COMPLETED.name)
    if facts.state == "cancelled":
        return End(CANCELLED.name, evidence=facts.reason)
    if facts.state == "timeout":
        return End(WALLTIME.name, evidence=facts.reason)
    if facts.state == "hung":
        node = lost[-1].node if lost else ""
        return End(HANG.name, node, facts.reason)
    if facts.why == files.WHY_SCREENED_OUT:
        node = screened[0].node if screened else ""
        return End(SCREENED_OUT.name, node, facts.reason)
    if facts.setup_failed:
        return End(SETUP_FAILED.name, evidence=facts.reason or facts.setup_failed)
    said = finding.signature if finding is not None else None
    pointed = getattr(said, "end", None) or (
        NODE_LOST.name if said is not None and said.node_fault else None
    )
    if pointed in (DISK_FULL.name, WALLTIME.name, SETUP_FAILED.name, HANG.name):
        return End(pointed, evidence=line)
    if lost:  # failover saw each attempt: the node lost last ended the job
        return End(NODE_LOST.name, lost[-1].node, lost[-1].evidence)
    if pointed == NODE_LOST.name and finding.host:
        return End(NODE_LOST.name, finding.host, line)
    if left:
        return End(STRAGGLER_LEFT.name, left[-1].node, left[-1].evidence)
    seen_on = finding.host if finding is not None else ""  # where the failure was seen
    if not facts.first_step:
        return End(NO_FIRST_STEP.name, seen_on, line or facts.reason)
    return End(CRASH.name, seen_on, line or facts.reason)
