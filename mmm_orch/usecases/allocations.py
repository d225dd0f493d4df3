"""Held allocations (`mmm-orch allocate`): one batch job that runs the runs it is given while it
lives, each a job of its own in the database with its own log, exit code and checkpoints.

A run sent into one (`submit --into ID`, the API's `Allocation.submit`) is planned, rendered and
recorded at once, `waiting` in the allocation's group (the backlog's mover leaves it alone).
Inside the allocation, `mmm-orch hold` (`hold` here) takes the waiting runs first come first,
each into free node or device slots as a pack's points take them (submission/pack.Room), claims
it (a compare-and-set: one holder starts it, once), places it on its slot, and starts it under
the local executor as `launch` starts a job, held by the holder.

Near the end, by one rule: a run starts only where its walltime fits the time the allocation
has left less END_SLACK_S, so a run started can finish. The holder ends END_SLACK_S before its
walltime, or at the scheduler's SIGTERM (a cancel, a preemption): it stops its running runs
(SIGTERM, on which the trainers checkpoint) and gives back what did not finish: a run it stopped
as a new waiting run going on from that run's latest checkpoint, and a run it never started as
it was sent. They wait for the allocation made `--after` this one, which takes the runs of this
one that it has not started, at any time."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable

from mmm_orch.config.registry import load_machine
from mmm_orch.errors import InvalidValue, MmmError, SubmissionRefused, one_line
from mmm_orch.planning import Plan, Request, placement
from mmm_orch.planning.store import stored_plan
from mmm_orch.progress import refresh as progress
from mmm_orch.records.db import JobDB, db_path, open_db
from mmm_orch.records.dbfile import jobs_root_for
from mmm_orch.records.record import ALLOCATION, PACK_INDEX, JobRecord
from mmm_orch.rendering import render
from mmm_orch.schedulers import current_allocation
from mmm_orch.schedulers.states import JobState
from mmm_orch.submission import pack, submit
from mmm_orch.usecases.packs import check_packable, program, runs_once
from mmm_orch.usecases.plans import bad_nodes, counted_plan, plan
from mmm_orch.usecases.submissions import NOTHING_YET, Prepared, prepare_plan, ready, target
from mmm_orch.walltime import format_walltime

POLL_S = 0.25  # between two looks for new runs and ended ones: a database read each
END_SLACK_S = pack.END_SLACK_S  # the holder's end before the walltime's (it stops, gives back)
STOP_WAIT_S = 3.0  # for the stopped runs to save before they are given back (Slurm's KillWait
# is 30 s by default, PBS's kill_delay 10 s: the records are written well within either)


@dataclasses.dataclass(frozen=True)
class Held:
    """An allocation as recorded: its job (whose id names it) and its group's spec."""

    job: JobRecord
    group: int
    spec: dict

    @property
    def id(self) -> int:
        return self.job.id


def held(db: JobDB | None, job_id: int, field: str = "--into") -> Held:
    """Allocation `job_id` (the id `allocate` printed: its job's)."""
    record = db.get(job_id, events=False) if db is not None else None
    group = db.groups.get(record.group_id) if db and record and record.group_id else None
    if (
        record is None
        or group is None
        or group["kind"] != ALLOCATION
        or record.group_index != PACK_INDEX
    ):
        raise InvalidValue(
            field, job_id, "the id of an allocation, as `mmm-orch allocate` printed it"
        )
    return Held(record, group["id"], group["spec"])


# -- allocate --------------------------------------------------------------------------------


def prepare(
    request: Request,
    db: str | None = None,
    template: str | None = None,
    host: str | None = None,
    after: int | None = None,
    env_check: bool = True,
    review: bool = False,
) -> Prepared:
    """The allocation's job, checked as a submission is: `request.nodes` nodes for its walltime,
    in a queue with room for one more job of the user's (`review`: offline), running the holder
    once on its first node. `after`: an earlier allocation on the same machine, whose runs this
    one takes."""
    remote = host if review else target(request.machine, host)
    if remote:
        raise MmmError(
            f"allocate runs on {request.machine}'s login node, not through --host/login_hosts "
            f"({remote}): the allocation reads the runs sent into it from this job database, "
            "which it must reach; run `mmm-orch allocate` and `submit --into` there (ssh to it)"
        )
    if after is not None:
        earlier = held(open_db(str(db_path(db))), after, "--after")
        if earlier.spec["machine"] != request.machine:
            raise InvalidValue(
                "--after",
                after,
                f"an allocation on {request.machine} (it is on {earlier.spec['machine']})",
            )
    asked = dataclasses.replace(
        request,
        workload="command",
        command=("true",),
        options=(),
        nodes=request.nodes or 1,
        spare_nodes=0,
        name=request.name or f"{request.machine}-allocation",
    )
    job, load = counted_plan(asked, db, None if review else "")
    check_packable(job.machine, job.scheduler, "allocate")
    job = runs_once(job, program(job, db, "hold", "<allocation group>"))
    return prepare_plan(job, template, None, env_check and not review, db=db, load=load)


def allocate(prepared: Prepared, db: str | None = None, after: int | None = None) -> JobRecord:
    """Record the allocation's group, then submit its job (a refused one leaves no group)."""
    where = db_path(db)
    opened = open_db(str(where), create=True)
    job = prepared.plan
    group = opened.groups.new(
        ALLOCATION,
        {
            "machine": job.machine,
            "nodes": job.layout.nodes,
            "walltime": job.queue.walltime,
            "template": prepared.template,
            "after": held(opened, after, "--after").group if after is not None else None,
        },
    )
    job = runs_once(job, program(job, db, "hold", str(group)))
    try:
        return submit.submit(
            job, where, prepared.template, links={"group_id": group, "group_index": PACK_INDEX}
        )
    except BaseException:
        opened.groups.delete_empty(group)
        raise


# -- submit --into ---------------------------------------------------------------------------


def prepare_run(
    request: Request,
    into: int,
    db: str | None = None,
    template: str | None = None,
    env_check: bool = True,
) -> tuple[Prepared, Held]:
    """A run for allocation `into`: planned as a job of its machine (no queue limits: it runs in
    the allocation), and refused where it never fits one like it: more nodes than it has, or a
    walltime past its own less END_SLACK_S."""
    opened = open_db(str(db_path(db)))
    allocation = held(opened, into)
    assert opened is not None  # held() found the allocation in it
    machine = allocation.spec["machine"]
    if request.machine != machine:
        raise InvalidValue(
            "--into", into, f"an allocation on {request.machine} (it is on {machine})"
        )
    planned = plan(dataclasses.replace(request, queue_load=NOTHING_YET), db)
    if planned.layout.nodes + planned.placement.spare_nodes > allocation.spec["nodes"]:
        raise InvalidValue(
            "--nodes",
            planned.layout.nodes,
            f"at most allocation {into}'s {allocation.spec['nodes']}",
        )
    longest = allocation.spec["walltime"] - END_SLACK_S
    if planned.queue.walltime > longest:
        raise InvalidValue(
            "--walltime",
            planned.queue.walltime_hms,
            f"at most {format_walltime(longest)}: allocation {into}'s walltime less "
            f"{END_SLACK_S} s, so that it can finish there",
        )
    (now,) = progress_of(opened, [allocation.job])
    if now.terminal:
        raise MmmError(
            f"--into {into}: allocation {into} has ended ({now.state.value}); "
            f"`mmm-orch allocate {machine} ... --after {into}` makes one that takes its runs"
        )
    return ready(planned, template, "", env_check), allocation


def send(prepared: Prepared, allocation: Held, db: str | None = None) -> JobRecord:
    """Record the run waiting in `allocation`, whose holder starts it when it has room."""
    opened = open_db(str(db_path(db)), create=True)
    index = 1 + max((r.group_index or 0 for r in opened.list(group_id=allocation.group)), default=0)
    record = submit.submit(
        prepared.plan,
        db_path(db),
        prepared.template,
        links={"group_id": allocation.group, "group_index": index},
        backlog=True,
    )
    opened.note(record.id, f"waiting in allocation {allocation.id}")
    return opened.get_existing(record.id)


def runs(db: JobDB, allocation: Held) -> list[JobRecord]:
    """The runs sent into `allocation` and given back by it, refreshed, first sent first."""
    sent = [r for r in db.list(group_id=allocation.group) if r.group_index]
    progress.refresh(db, [r for r in sent if not r.terminal and r.native_id])
    return [db.get_existing(r.id, events=False) for r in sent]


def progress_of(db: JobDB, records: list[JobRecord]) -> list[JobRecord]:
    """`records` refreshed from their schedulers."""
    progress.refresh(db, [r for r in records if not r.terminal])
    return [db.get_existing(r.id, events=False) for r in records]


# -- inside the allocation: the holder --------------------------------------------------------


@dataclasses.dataclass
class _Run:
    """A waiting run as pack.Room sizes it."""

    record: JobRecord
    plan: Plan
    index: int = 0

    @property
    def nodes(self) -> int:  # (its spares too)
        return self.plan.layout.nodes + self.plan.placement.spare_nodes

    @property
    def devices(self) -> int:  # of one node; 0: whole nodes
        share = self.plan.devices.share
        return len(share.held) if share is not None else 0


def hold(group_id: int, db: str | None = None, said: Callable[[str], None] = print) -> int:
    """Inside the allocation: start the runs sent into it as room frees up until its end (see
    the module's docstring); a KeyboardInterrupt (the scheduler's SIGTERM) ends it early. The
    number of runs it started."""
    opened = open_db(str(db_path(db)))
    group = opened.groups.get(group_id) if opened is not None else None
    if opened is None or group is None or group["kind"] != ALLOCATION:
        raise MmmError(f"group {group_id} is no allocation in {db_path(db)}")
    spec = group["spec"]
    listed = next(r for r in opened.list(group_id=group_id) if r.group_index == PACK_INDEX)
    job = opened.get_existing(listed.id, events=False)  # with its plan
    name = f"allocation {job.id}"
    allocation = current_allocation()
    if allocation is None:
        raise MmmError(f"{name}: not inside an allocation")
    machine = load_machine(spec["machine"])
    allocation = placement.as_the_profile_lists(
        machine.name, stored_plan(job.plan, f"job {job.id}'s plan").placement.node_list, allocation
    )
    pool = placement.nodes_for(
        allocation, Request(machine.name, "command"), 0, bad_nodes(db, machine.name)
    )
    slots = machine.devices.slots
    room = pack.Room(pool, len(slots.ids) if slots is not None else 1)
    root = jobs_root_for(db_path(db))
    sources = [group_id] + ([spec["after"]] if spec.get("after") else [])
    running: dict[int, tuple[JobRecord, pack.Slot]] = {}
    started = 0
    said(f"{name} holds {len(pool)} node(s) ({','.join(pool)}): taking runs")

    def left() -> float:
        return float("inf") if allocation.ends_at is None else allocation.ends_at - time.time()

    def note(run: JobRecord, reason: str) -> None:
        if run.reason != reason:
            opened.note(run.id, reason)

    try:
        while left() > END_SLACK_S:
            sent = [r for s in sources for r in opened.list(group_id=s, state=JobState.WAITING)]
            for each in sorted(sent, key=lambda r: r.id):
                record = opened.get_existing(each.id, events=False)  # with its plan
                run = _Run(record, stored_plan(record.plan, f"job {record.id}'s plan"))
                if run.plan.queue.walltime > left() - END_SLACK_S:
                    note(
                        record,
                        f"not started in {name}: its walltime, "
                        f"{run.plan.queue.walltime_hms}, is past the {format_walltime(int(left()))} "
                        "it has left",
                    )
                    continue
                if run.nodes > len(pool):
                    note(
                        record, f"waiting: {run.nodes} nodes, past the {len(pool)} usable in {name}"
                    )
                    continue
                slot = room.take(run)
                if slot is None:
                    note(record, f"waiting in {name} for room")
                    continue
                placed = placement.placed_on(run.plan, allocation, slot.nodes, root)
                if slot.devices:
                    placed = placed.on_devices(slot.devices)
                try:
                    begun = submit.start_here(
                        opened, record, placed, render(placed, spec.get("template")), group_id
                    )
                except (SubmissionRefused, MmmError) as exc:
                    said(f"job {record.id} not started: {one_line(str(exc))}")
                    begun = None
                if begun is None:  # taken by another holder, or refused: the slot is free
                    room.give_back(slot)
                    continue
                running[begun.id] = (begun, slot)
                started += 1
                said(f"job {begun.id} started on {','.join(slot.nodes)}")
            if running:
                for now in progress_of(opened, [r for r, _ in running.values()]):
                    if now.terminal:
                        room.give_back(running.pop(now.id)[1])
                        said(f"job {now.id} {now.state.value} (exit {_code(now)})")
            time.sleep(POLL_S)
        said(f"its walltime ends in {int(left())} s: stopping")
    finally:
        _end(opened, name, group_id, spec.get("template"), [r for r, _ in running.values()], said)
    return started


def _end(
    db: JobDB,
    name: str,
    group_id: int,
    template: str | None,
    running: list[JobRecord],
    said: Callable[[str], None],
) -> None:
    """Stop the running runs (SIGTERM: they checkpoint) and give back what did not finish."""
    stopping = [
        threading.Thread(target=_stop, args=(db, record), daemon=True) for record in running
    ]
    for thread in stopping:
        thread.start()
    deadline = time.monotonic() + STOP_WAIT_S
    for thread in stopping:
        thread.join(max(0.0, deadline - time.monotonic()))
    for record in progress_of(db, running) if running else []:
        # Ended by the end whichever way: the holder's SIGTERM, or the scheduler's reaching it
        # first (a training that saved exits 75 then); only a run that completed is done.
        if record.state is JobState.COMPLETED:
            continue
        again = give_back(db, record, group_id, name, template)
        said(f"job {record.id} stopped at the end: given back as job {again.id}")
    left = [r for r in db.list(group_id=group_id, state=JobState.WAITING) if not r.rerun_of]
    for record in left:
        db.note(
            record.id,
            f"not started in {name}, which ended: waiting for the allocation made --after it",
        )
    said(f"ended: {len(running)} running run(s) stopped and given back, {len(left)} not started")


def _stop(db: JobDB, record: JobRecord) -> None:
    with contextlib.suppress(MmmError):  # it ended meanwhile
        submit.cancel(db, record)


def give_back(
    db: JobDB, record: JobRecord, group_id: int, name: str, template: str | None
) -> JobRecord:
    """A run stopped at its allocation's end, as a new waiting run going on from its latest
    checkpoint (from the start where it saved none, or cannot resume)."""
    sent = stored_plan(record.plan, f"job {record.id}'s plan")
    again = sent
    if sent.launch.can_resume:
        again = sent.with_launch(args={**sent.launch.args, "resume": True, "allow_fresh": True})
    made = submit.submit(
        again,
        db.path,
        template,
        links={"group_id": group_id, "group_index": record.group_index, "rerun_of": record.id},
        backlog=True,
    )
    how = "from its latest checkpoint" if sent.launch.can_resume else "from the start"
    db.note(
        made.id,
        f"given back by {name} at its end (job {record.id}): goes on {how} in "
        "the allocation made --after it",
    )
    return db.get_existing(made.id)


def _code(record: JobRecord) -> str:
    return str(record.exit_code) if record.exit_code is not None else "-"
