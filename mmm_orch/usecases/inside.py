"""The use cases inside an allocation the scheduler already gave: `launch` (one run on its nodes,
in the foreground, recorded as a job; with --allocate, in an allocation asked for here) and
`sweep --within` (a sweep's points side by side on its nodes, submission/pack.py). Each takes values
and returns plans and records, as the use cases of mmm_orch.usecases do."""

from __future__ import annotations

import dataclasses
import socket
import sys
import time
from collections.abc import Callable

from mmm_orch.errors import InvalidValue, MmmError, SchedulerError
from mmm_orch.planning import Plan, Request, placement, resolve
from mmm_orch.progress import refresh as progress
from mmm_orch.records.db import db_path, open_db
from mmm_orch.records.dbfile import jobs_root_for
from mmm_orch.records.record import JobRecord
from mmm_orch.schedulers import current_allocation, scheduler_kind
from mmm_orch.submission import launch as launching
from mmm_orch.submission import pack, preflight, submit, sweeps
from mmm_orch.submission.launch import write_exit_report as write_exit_report
from mmm_orch.submission.submit import stop_signals as stop_signals
from mmm_orch.usecases.plans import bad_nodes, plan
from mmm_orch.usecases.submissions import Prepared, cancel, ready


def launch(
    request: Request,
    db: str | None = None,
    template: str | None = None,
    first_node: int = 0,
    use_bad_nodes: bool = False,
    env_check: bool = True,
) -> Prepared:
    """A plan to run inside the allocation this process runs in, on all its nodes (less the known
    bad) or `request.nodes` of them from `first_node` on; checked like a submission. Without a
    machine, the one whose hostnames match (planning/placement.which_machine). Outside an allocation,
    the error names the command that gets one for this plan."""

    allocation = current_allocation()
    machine = placement.which_machine(request.machine, allocation, socket.gethostname())
    request = dataclasses.replace(request, machine=machine)
    planned = plan(request, db)
    if not scheduler_kind(planned.scheduler).batch:  # it runs here, as a submission does
        if request.command:
            launching.check_program(planned, request.command[0])
        return ready(planned, template, "", env_check)
    if allocation is None:
        raise MmmError(
            f"launch: not inside an allocation on {planned.machine}: get one with "
            f"`{launching.allocation_hint(planned)}` and launch in it (or submit a batch "
            "job: `mmm-orch submit`)"
        )
    if allocation.scheduler != planned.scheduler:
        raise MmmError(
            f"machine {planned.machine!r} is invalid here: it schedules with "
            f"{planned.scheduler}, and this runs inside {allocation.scheduler} job "
            f"{allocation.job_id}; name this allocation's machine"
        )
    allocation = placement.as_the_profile_lists(
        planned.machine, planned.placement.node_list, allocation
    )
    bad = () if use_bad_nodes else bad_nodes(db, request.machine)
    nodes = placement.nodes_for(allocation, request, first_node, bad)
    sized = resolve(dataclasses.replace(request, nodes=len(nodes)))
    launching.check_fits(sized, allocation)
    if request.command:
        launching.check_program(sized, request.command[0])
    return ready(
        placement.placed_on(sized, allocation, nodes, jobs_root_for(db_path(db))),
        template,
        "",
        env_check,
    )


def allocation_for_launch(
    request: Request,
    launch_words: list[str],
    program: tuple[str, ...],
    report: str,
    db: str | None = None,
) -> tuple[Plan, list[str]]:
    """`launch --allocate`: the plan, and the command that gets an allocation for it from the
    scheduler (salloc, qsub -I) and runs `mmm-orch` `launch_words` (the launch as asked, less
    --allocate) in it, reporting the launched job's exit code to the file `report`."""

    allocation = current_allocation()
    if allocation is not None:
        raise MmmError(
            f"--allocate: this already runs inside {allocation.scheduler} job "
            f"{allocation.job_id}; launch without --allocate"
        )
    machine = placement.which_machine(request.machine, None, socket.gethostname())
    planned = plan(dataclasses.replace(request, machine=machine), db, "")  # salloc/qsub -I: here
    if not scheduler_kind(planned.scheduler).batch:
        raise MmmError(
            f"--allocate: machine {machine} has no scheduler to get an allocation "
            "from; launch without --allocate"
        )
    return planned, launching.allocate_argv(planned, _inner_launch(launch_words, program, report))


def _inner_launch(launch_words: list[str], program: tuple[str, ...], report: str) -> list[str]:
    """The launch that runs inside the allocation, reporting its exit code to `report`."""
    return [
        sys.executable,
        "-m",
        "mmm_orch",
        *launch_words,
        "--report-to",
        report,
        *(["--", *program] if program else []),
    ]


def launch_in_a_new_allocation(
    request: Request, launch_words: list[str], program: tuple[str, ...], db: str | None = None
) -> int:
    """Run allocation_for_launch's command in the foreground; the launched job's exit code (the
    launch inside reports it in a file: qsub -I returns 0 whatever ran in it)."""

    report = jobs_root_for(db_path(db)) / f"launch-{submit.new_tag()}.json"
    planned, _ = allocation_for_launch(request, launch_words, program, str(report), db)
    inner = _inner_launch(launch_words, program, str(report))
    report.parent.mkdir(parents=True, exist_ok=True)
    launching.allocate(
        planned,
        db_path(db),
        lambda name, tag: launching.allocate_argv(planned, inner, name, tag),
        lambda argv: launching.run_allocation(planned, argv),
    )
    code = launching.read_exit_report(report)
    if code is None:
        raise SchedulerError(
            f"--allocate: the allocation ended without the launch's report "
            f"({report}): the scheduler refused it or ended it first; see its "
            "output above"
        )
    return code


def submit_here(prepared: Prepared, db: str | None = None) -> JobRecord:
    """Run a launch's plan on this computer under the local executor, recorded as a job."""

    return submit.submit(prepared.plan, db_path(db), prepared.template, here=True)


def sweep_within(
    request: Request,
    nodes: str | None,
    sets: list[str],
    db: str | None = None,
    template: str | None = None,
    env_check: bool = True,
    said: Callable[[str], None] = lambda text: None,
    devices: str | None = None,
) -> tuple[int, list[JobRecord]]:
    """`sweep --within`: every point run inside the allocation this process runs in, side by
    side on its nodes as they free up (submission/pack.py), each an ordinary job of the sweep's group
    held by this process; in the foreground until all have ended. Everything is planned and
    checked before the first point is recorded. `said` hears each point start and end."""

    allocation = current_allocation()
    machine = placement.which_machine(request.machine, allocation, socket.gethostname())
    if allocation is None:
        raise MmmError(
            f"--within: not inside an allocation on {machine}: get one (salloc, "
            "qsub -I) and run the sweep in it, or submit it as jobs (without --within)"
        )
    request = dataclasses.replace(request, machine=machine, avoid_nodes=bad_nodes(db, machine))
    swept = sweeps.axes(nodes, sets, devices)
    planned = sweeps.points(request, swept, new_jobs=False)  # no queue: they run in here
    allocation, pool = _room_for(planned, db, template)
    if env_check:
        preflight.check_job_python(planned[0].plan, "")
    sweep_id = sweeps.new_sweep(
        open_db(str(db_path(db)), create=True),
        swept,
        planned,
        within=f"{allocation.scheduler} job {allocation.job_id}",
    )
    return sweep_id, _run_in(allocation, pool, planned, sweep_id, db, template, said)


def run_points(
    points: list, sweep_id: int, db: str | None, template: str | None, said: Callable[[str], None]
) -> list[JobRecord]:
    """A pack's recorded points (submission/sweeps.Point), run in the allocation this process runs in
    as `sweep --within` runs its own."""
    allocation, pool = _room_for(points, db, template)
    return _run_in(allocation, pool, points, sweep_id, db, template, said)


def _room_for(points: list, db: str | None, template: str | None):
    """The allocation this process runs in and its usable nodes: every point fits them and
    renders on them, or nothing is recorded."""

    first = points[0].plan
    allocation = current_allocation()
    if allocation is None:
        raise MmmError(f"not inside an allocation on {first.machine}")
    if first.scheduler != allocation.scheduler:
        raise MmmError(
            f"machine {first.machine!r} is invalid here: it schedules with "
            f"{first.scheduler}, and this runs inside {allocation.scheduler} "
            f"job {allocation.job_id}; name this allocation's machine"
        )
    allocation = placement.as_the_profile_lists(
        first.machine, first.placement.node_list, allocation
    )
    pool = placement.nodes_for(
        allocation, Request(first.machine, first.workload), 0, bad_nodes(db, first.machine)
    )
    root = jobs_root_for(db_path(db))
    for point in points:  # each fits the allocation, and renders, before any is recorded
        if point.nodes > len(pool):
            raise InvalidValue(
                "--nodes",
                point.nodes,
                f"at most the {len(pool)} usable nodes of "
                f"{allocation.scheduler} job {allocation.job_id} (sweep point "
                f"{point.index}, {point.label})",
            )
        launching.check_fits(point.plan, allocation)
        ready(
            placement.placed_on(point.plan, allocation, pool[: point.nodes], root),
            template,
            "",
            env_check=False,
        )
    return allocation, pool


def _run_in(
    allocation,
    pool: tuple[str, ...],
    points: list,
    sweep_id: int,
    db: str | None,
    template: str | None,
    said: Callable[[str], None],
) -> list[JobRecord]:
    """Run `points` on `pool` as nodes free up (submission/pack.py), each recorded as a job of sweep
    `sweep_id` when it starts. Where the allocation says when it ends, each point's walltime
    ends before it, and a point there is no time left for is recorded `not started`. The
    sweep's records, in point order."""

    opened = open_db(str(db_path(db)), create=True)
    root = jobs_root_for(db_path(db))
    where = f"{allocation.scheduler} job {allocation.job_id}"

    last_start = [0.0]

    def start(point, slot: pack.Slot) -> JobRecord:
        if (wait := last_start[0] + point.plan.launch.start_gap - time.monotonic()) > 0:
            time.sleep(wait)  # the pause the facility asks for between background launches
        last_start[0] = time.monotonic()
        timed = _within_time(point.plan, allocation.ends_at)
        placed = placement.placed_on(timed, allocation, slot.nodes, root)
        if slot.devices:
            placed = placed.on_devices(slot.devices)
        record = submit.submit(
            placed,
            db_path(db),
            template,
            here=True,
            links={"group_id": sweep_id, "group_index": point.index},
        )
        share = placed.devices.share  # (on_devices gave it one where the slot has devices)
        devices = (
            f" devices {','.join(share.ids[i] for i in slot.devices)}"
            if slot.devices and share is not None
            else ""
        )
        said(
            f"point {point.index} ({point.label}): job {record.id} on "
            f"{','.join(slot.nodes)}{devices}"
        )
        return record

    def ended(running: list[JobRecord]) -> list[JobRecord]:
        progress.refresh(opened, running)
        done = [
            now
            for now in (opened.get_existing(r.id, events=False) for r in running)
            if now.terminal
        ]
        for record in done:
            said(
                f"point {record.group_index}: job {record.id} {record.state.value} (exit "
                f"{record.exit_code if record.exit_code is not None else '-'})"
            )
        return done

    def stop(running: list[JobRecord]) -> None:
        for line in cancel(opened, running):
            said(line)

    def never_started(late: list) -> None:
        for point in late:
            job_id = submit.record_not_started(
                point.plan,
                db_path(db),
                {"group_id": sweep_id, "group_index": point.index},
                f"{where} ended first",
            )
            said(
                f"point {point.index} ({point.label}): job {job_id} not started ({where} "
                "ends before it could run)"
            )

    def in_time(point) -> bool:
        return (
            allocation.ends_at is None
            or _time_left(allocation.ends_at)
            >= point.plan.guard.walltime_margin + pack.MIN_POINT_RUN_S
        )

    pack.run(
        points, pool, start, ended, stop, never_started, in_time, pack.devices_per_node(points)
    )
    return sorted(
        (r for r in opened.list(group_id=sweep_id) if r.group_index),
        key=lambda r: r.group_index or 0,
    )  # (none is 0 or None: filtered out)


def _time_left(ends_at: float) -> int:
    return int(ends_at - time.time()) - pack.END_SLACK_S


def _within_time(planned: Plan, ends_at: float | None) -> Plan:
    """`planned` with a walltime that ends before its allocation does."""
    if ends_at is None or _time_left(ends_at) >= planned.queue.walltime:
        return planned
    return dataclasses.replace(
        planned, queue=dataclasses.replace(planned.queue, walltime=_time_left(ends_at))
    )
