"""`sweep --pack`: one batch job whose allocation runs a sweep's points side by side, each
still a recorded job of the sweep (usecases/inside.py runs them, as `sweep --within` does).

At submission every point is planned and rendered, and the pack job is planned for the nodes
of the largest point (or --pack-nodes) and the walltime of the waves its points run in. The
sweep is recorded with its points' plans, then the pack job is submitted with it: inside the
allocation it runs `mmm-orch pack-run SWEEP` once, on the first node, without the
launcher, which reads the recorded plans and runs them. What was reviewed is what runs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from mmm_orch.errors import InvalidValue, MmmError
from mmm_orch.injob.protocol import EXIT_STOPPED_BY_TERM, PREFIX
from mmm_orch.planning import Plan, Request, cost
from mmm_orch.planning.model import ChainLink, JobPlace
from mmm_orch.planning.store import stored_plan
from mmm_orch.records.db import db_path, open_db
from mmm_orch.records.record import PACK_INDEX, JobRecord
from mmm_orch.rendering import render
from mmm_orch.schedulers import scheduler_kind
from mmm_orch.schedulers.states import JobState
from mmm_orch.submission import submit, sweeps
from mmm_orch.submission.pack import walltime_for
from mmm_orch.usecases import inside
from mmm_orch.usecases.plans import bad_nodes, counted_plan
from mmm_orch.usecases.submissions import Prepared, prepare_plan, resuming, target
from mmm_orch.walltime import format_walltime

EXIT_STOPPED = EXIT_STOPPED_BY_TERM  # `pack-run` stopped by the scheduler's SIGTERM


def in_the_log(text: str, who: str = "pack") -> str:
    """A line `pack-run` (or an allocation's `hold`) says in its job's log, marked as
    mmm-orch's own."""
    return f"{PREFIX} {who}: {text}"


@dataclasses.dataclass(frozen=True)
class Pack:
    swept: dict[str, list[str]]
    points: list  # submission/sweeps.Point, in order
    job: Prepared  # the pack job, its program to be named once the sweep is recorded


def pack_points(
    request: Request,
    nodes: str | None,
    sets: list[str],
    pack_nodes: int | None,
    pack_walltime: str | None = None,
    db: str | None = None,
    template: str | None = None,
    host: str | None = None,
    env_check: bool = True,
    review: bool = False,
    devices: str | None = None,
) -> Pack:
    """The sweep's points and the pack job that runs them, all checked: every point fits the
    pack's nodes and renders, the pack job has a queue with room (its user's jobs counted where
    it goes, `review`: offline) and keeps to the budgets. A pack where it cannot run is refused,
    in a review too."""
    # A review stays offline: only a --host given is known without looking for the submit
    # command (a machine's login_hosts are taken where it is not on PATH, at submission).
    remote = host if review else target(request.machine, host)
    if remote:
        raise MmmError(
            f"--pack submits from {request.machine}'s login node, not through "
            f"--host/login_hosts ({remote}): the pack job records its points in this "
            "job database, which it must reach; run the sweep there"
        )
    swept = sweeps.axes(nodes, sets, devices)
    shared = dataclasses.replace(request, avoid_nodes=bad_nodes(db, request.machine))
    points = sweeps.points(shared, swept, new_jobs=False)  # no queue: they run in the pack
    check_packable(request.machine, points[0].plan.scheduler)
    largest = max(points, key=lambda point: point.nodes)
    if pack_nodes is not None:
        if pack_nodes < 1:
            raise InvalidValue("--pack-nodes", pack_nodes, "a whole number of nodes, 1 or more")
        if largest.nodes > pack_nodes:
            raise InvalidValue(
                "--pack-nodes",
                pack_nodes,
                f"at least the {largest.nodes} nodes "
                f"of sweep point {largest.index} ({largest.label})",
            )
    # A template of the user's is tried on every point before the machine is contacted; the
    # packaged ones on the first (as for one job): each point renders again where it runs.
    for point in points if template is not None else points[:1]:
        render(point.plan, template)
    asked = _pack_request(shared, points, pack_nodes or largest.nodes, pack_walltime)
    try:
        job, load = counted_plan(asked, db, None if review else "")
    except MmmError as exc:
        if pack_walltime:
            raise
        raise MmmError(
            f"{exc}: the pack's walltime, {asked.walltime}, is its points' waves on "
            f"{asked.nodes} node(s); give --pack-walltime (points it leaves no time "
            "for are recorded `not started`) or more --pack-nodes"
        ) from None
    job = runs_once(job, program(job, db, "pack-run", "<sweep id>"))
    return Pack(
        swept, points, prepare_plan(job, template, None, env_check and not review, db=db, load=load)
    )


def check_packable(machine: str, scheduler: str, asked: str = "--pack") -> None:
    """A pack's points share the allocation its job is granted: a machine whose scheduler grants
    none (the local executor runs each job here at once) has nothing for them to run in."""
    if not scheduler_kind(scheduler).batch:
        raise MmmError(
            f"{asked}: machine {machine} runs its jobs on this computer without a batch "
            "scheduler, so a pack job has no allocation for its points to share; run the "
            "sweep without --pack (each point is a job of its own here)"
        )


def _pack_request(shared: Request, points: list, nodes: int, walltime: str | None) -> Request:
    """The pack job: `nodes` nodes for `walltime`, by default for the waves its points run in
    at most (submission/pack.walltime_for)."""
    walltime = walltime or format_walltime(walltime_for(points, nodes))
    return dataclasses.replace(
        shared,
        workload="command",
        command=("true",),
        options=(),
        nodes=nodes,
        spare_nodes=0,
        walltime=walltime,
        name=shared.name or f"{points[0].plan.name}-pack",
    )


def runs_once(job: Plan, program: tuple[str, ...]) -> Plan:
    """`job` running `program` once, on the allocation's first node (where the script runs),
    without the launcher, the watchdog or the screen: each point has its own launch and watchdog
    (its nodes are not screened: a node the screen left out would still be the runs')."""
    return dataclasses.replace(
        job.with_launch(launcher=(), hosts="", command=program),
        guard=dataclasses.replace(job.guard, first_step_timeout=0, step_timeout=0, screen=None),
    )


def program(job: Plan, db: str | None, *words: str) -> tuple[str, ...]:
    """What a job that holds runs (a pack's, an allocation's) runs: `mmm-orch WORDS` on the job
    database `db`, which records its runs."""
    return (job.launch.python, "-m", "mmm_orch", "--db", str(db_path(db).resolve()), *words)


def submit_pack(
    pack: Pack, db: str | None = None, rerun_of: int | None = None
) -> tuple[int, JobRecord]:
    """Record the sweep with its points' plans, then submit the pack job that runs them; a
    refused submission leaves no sweep behind."""
    where = db_path(db)
    opened = open_db(str(where), create=True)
    template = pack.job.template
    sweep_id = sweeps.new_sweep(opened, pack.swept, pack.points, pack={"template": template})
    job = runs_once(pack.job.plan, program(pack.job.plan, db, "pack-run", str(sweep_id)))
    links = {
        "group_id": sweep_id,
        "group_index": PACK_INDEX,
        **({"rerun_of": rerun_of} if rerun_of is not None else {}),
    }
    try:
        record = submit.submit(job, where, template, links=links)
    except BaseException:
        opened.groups.delete_empty(sweep_id)
        raise
    return sweep_id, record


def rerun_pack(old: JobRecord, resume: bool, db: str | None = None) -> tuple[int, JobRecord]:
    """`rerun` of a pack job: a new pack of the points that did not complete, on as many nodes
    for as long; `resume`: a point that ran goes on from its run's latest checkpoint (one that
    never started, fresh)."""
    opened = open_db(str(db_path(db)))
    if opened is None or old.group_id is None:  # (a pack job is recorded in its sweep's group)
        raise MmmError(f"rerun: job {old.id} is no pack job in {db_path(db)}")
    recorded = stored_plan(old.plan, f"job {old.id}'s recorded plan")
    # (a pack recorded by a version that did not refuse it)
    check_packable(recorded.machine, recorded.scheduler, f"rerun: job {old.id} is a pack")
    group, ran = sweeps.sweep_jobs(opened, old.group_id)
    by_index = {record.group_index: record for record in ran}
    left: list[sweeps.Point] = []
    for point in _recorded(opened, group):
        record = by_index.get(point.index)
        if record is not None and record.state is JobState.COMPLETED:
            continue
        left.append(
            sweeps.Point(len(left) + 1, point.values, _again(opened, point.plan, record, resume))
        )
    if not left:
        raise MmmError(
            f"rerun: every point of sweep {group['id']} completed; nothing is left to run"
        )
    job = dataclasses.replace(
        recorded,
        submission=JobPlace(),
        chain=ChainLink(),
    )
    job = job.with_launch(workdir_given=True)
    prepared = prepare_plan(job, group["spec"]["pack"].get("template"), None, env_check=True, db=db)
    return submit_pack(Pack(group["spec"]["axes"], left, prepared), db, rerun_of=old.id)


def rerun_point(old: JobRecord, resume: bool, db: str | None = None) -> tuple[int, JobRecord]:
    """`rerun` of one point of a pack: a new pack of that point alone, sized for it (its nodes,
    its walltime), in a queue picked as for one job; `resume`: from its run's latest
    checkpoint."""
    opened = open_db(str(db_path(db)))
    if opened is None or old.group_id is None or old.group_index is None:
        raise MmmError(f"rerun: job {old.id} is no point of a pack in {db_path(db)}")
    group, _ = sweeps.sweep_jobs(opened, old.group_id)
    point = _recorded(opened, group)[old.group_index - 1]
    again = sweeps.Point(1, point.values, _again(opened, point.plan, old, resume))
    pack_job = sweeps.pack_job(opened, group)
    if pack_job is None:
        raise MmmError(f"rerun: sweep {group['id']} is not a pack")
    pack_id = pack_job.id
    # The listing leaves plans out: the whole record has it.
    pack = stored_plan(opened.get_existing(pack_id).plan, f"job {pack_id}'s recorded plan")
    check_packable(pack.machine, pack.scheduler, f"rerun: job {old.id} is a point of a pack")
    asked = _pack_request(
        Request(pack.machine, "command", account=pack.queue.account, name=pack.name),
        [again],
        point.nodes,
        None,
    )
    job, load = counted_plan(asked, db, "")
    job = runs_once(
        job.with_launch(workdir=pack.launch.workdir, workdir_given=True),
        program(job, db, "pack-run", "<sweep id>"),
    )
    template = group["spec"]["pack"].get("template")
    prepared = prepare_plan(job, template, None, env_check=True, db=db, load=load)
    return submit_pack(Pack(group["spec"]["axes"], [again], prepared), db, rerun_of=old.id)


def _again(opened, planned: Plan, record: JobRecord | None, resume: bool) -> Plan:
    """A point's recorded plan to run again; `resume`: one that ran goes on from its run's
    latest checkpoint (one that never started, fresh)."""
    if record is None or record.state is JobState.NOT_STARTED or not resume:
        return planned
    earlier = stored_plan(opened.get(record.id).plan, f"job {record.id}'s recorded plan")
    return resuming(
        planned.with_launch(
            args={**planned.launch.args, "run_name": earlier.launch.args.get("run_name")}
        )
    )


def run_pack(
    sweep_id: int, db: str | None = None, said: Callable[[str], None] = lambda text: None
) -> list[JobRecord]:
    """Inside the pack job: its sweep's recorded points run side by side on its nodes."""
    opened = open_db(str(db_path(db)))
    group = opened.groups.get(sweep_id) if opened is not None else None
    if group is None or not isinstance(group["spec"].get("pack"), dict):
        raise MmmError(f"sweep {sweep_id} is not a pack in {db_path(db)}")
    return inside.run_points(
        _recorded(opened, group), sweep_id, db, group["spec"]["pack"].get("template"), said
    )


def _recorded(opened, group: dict) -> list:
    """A pack's points (submission/sweeps.Point) with the plans recorded when it was submitted."""
    values = sweeps.recorded_points(group)
    plans = opened.groups.plans(group["id"])
    if len(plans) != len(values):
        raise MmmError(
            f"sweep {group['id']}'s recorded plans are damaged ({len(plans)} for "
            f"{len(values)} points, not one a point as mmm-orch writes them): it was "
            "changed by hand"
        )
    return [
        sweeps.Point(index, point, stored_plan(plan, f"sweep {group['id']}'s point {index}"))
        for index, (point, plan) in enumerate(zip(values, plans, strict=True), start=1)
    ]


def review_lines(pack: Pack) -> list[str]:
    """What `sweep --pack --dry-run` says after the pack job's script."""
    job = pack.job.plan
    lines = [
        f"pack of {len(pack.points)} points of {pack.points[0].plan.workload} on "
        f"{job.machine}: one job of {job.layout.nodes} node(s), queue "
        f"{job.queue.name or '-'}, walltime {job.queue.walltime_hms}"
        + (f", at most {cost.hours(job.cost.most)} {job.cost.unit}" if job.cost else "")
        + " (nothing submitted)"
    ]
    for point in pack.points:
        layout, share = point.plan.layout, point.plan.devices.share
        held = (
            f"{point.devices} of a node's {len(share.ids)} devices"
            if share
            else f"{layout.nodes} nodes x {layout.ranks_per_node}"
        )
        lines.append(f"  {point.index:>3}  {point.label:<32} {held} = {layout.ranks} ranks")
    return lines
