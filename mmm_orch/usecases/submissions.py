"""Submit: one job, a chain, a sweep; and cancel. A submission is prepared before anything is
written or sent: the plan is resolved (usecases/plans.py), the template renders (once, to check
it), the budgets and the queue's room are checked, the login host is chosen and the job's own
Python is checked there (submission/preflight.py). Only then do submission/submit.py,
submission/chains.py and submission/sweeps.py write, record and submit."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

from mmm_orch.errors import InvalidValue, MmmError, QueueFull
from mmm_orch.planning import Plan, Request, cost, resolve
from mmm_orch.planning.occupancy import NOTHING_YET, QueueLoad
from mmm_orch.records.db import JobDB, db_path, open_db
from mmm_orch.records.record import JobRecord
from mmm_orch.rendering import render
from mmm_orch.schedulers.states import JobState
from mmm_orch.usecases.plans import bad_nodes, counted_plan


@dataclass(frozen=True)
class Prepared:
    """A plan checked for submission: its template renders, and where it goes (`remote`: the
    login host to submit through, "" for this computer)."""

    plan: Plan
    template: str | None
    remote: str
    budget: float | None = None  # node-hours the budgets leave (a chain's links keep to it)
    # What the submission says once it is made (a stack not checked lately), one line each.
    notes: tuple[str, ...] = ()


def prepare(
    request: Request,
    db: str | None = None,
    template: str | None = None,
    host: str | None = None,
    env_check: bool = True,
    chain: int = 0,
    backlog: bool = False,
) -> Prepared:
    """Everything that can be checked before a submission writes anything: the plan (the user's
    jobs counted where it goes; with `backlog` not: its runs wait for room), a chain's
    conditions, the template, the login host, and the job's Python there."""
    if backlog:
        request = dataclasses.replace(request, queue_load=NOTHING_YET)
    else:
        request = dataclasses.replace(request, jobs=max(chain, 1))
    checked, load = counted_plan(request, db, target(request.machine, host))
    return prepare_plan(checked, template, host, env_check, chain, db, load, backlog)


def target(machine_name: str, host: str | None) -> str:
    """Where `machine`'s jobs are submitted from: --host, here, or its first login host."""
    from mmm_orch.config.registry import load_machine
    from mmm_orch.submission.preflight import login_target

    machine = load_machine(machine_name)
    return login_target(
        machine.name,
        machine.scheduler.kind,
        dataclasses.asdict(machine.scheduler.commands),
        machine.login_hosts,
        host,
    )


def prepare_plan(
    checked: Plan,
    template: str | None = None,
    host: str | None = None,
    env_check: bool = True,
    chain: int = 0,
    db: str | None = None,
    load: QueueLoad | None = None,
    backlog: bool = False,
) -> Prepared:
    """`prepare` for a plan already made (the Python API's `submit(plan)`: what was reviewed is
    what is submitted); `load`: the user's jobs as counted for it (else counted here; with
    `backlog` not at all: its runs wait for room)."""
    from mmm_orch.submission.preflight import target_for

    budget = within_budgets(checked, db, "a chain's first link" if chain else "this job")

    remote = target_for(checked, host)
    notes = check_stacks([checked])
    if not backlog:
        check_room(checked, max(chain, 1), remote, db, load)
    # One job with the packaged templates is rendered once, at submission (a failure there
    # undoes everything); a template of the user's, and a chain's links, are tried first.
    scripts = [checked] if template is not None else []
    if chain:  # a chain's first link, and one that resumes: what its scripts differ by
        scripts = chain_links(checked, chain)[:2]
    prepared = ready(checked, template, remote, env_check, scripts, budget)
    return dataclasses.replace(prepared, notes=notes)


def check_stacks(plans: list[Plan]) -> tuple[str, ...]:
    """Before the queue: each plan's stack as its machine's last software check found it. A
    stack found broken is refused (MmmError); the notes for those not checked lately."""
    from mmm_orch.planning.software import gate

    seen, notes = set(), []
    for each in plans:
        key = (each.machine, each.environment.stack or "default")
        if not each.environment.setup or key in seen:
            continue  # a stack of no lines (a machine without modules) has nothing to check
        seen.add(key)
        if note := gate(*key):
            notes.append(note)
    return tuple(notes)


def check_room(
    checked: Plan, jobs: int, remote: str, db: str | None, load: QueueLoad | None = None
) -> None:
    """Refuse a plan whose queue cannot take `jobs` more of the user's jobs (a plan made before,
    or recorded: its queue is fixed)."""
    from mmm_orch.submission import queue_load

    if not queue_load.limits_apply(checked):
        return
    queue_load.check_room(checked, jobs, load or queue_load.read(checked, remote, open_db(db)))


def within_budgets(
    checked: Plan, db: str | None, what: str, most: float | None = None
) -> float | None:
    """Refuse a plan (or the `most` a sweep's points can be charged together) over the budgets:
    --max-node-hours (checked when planned) and the account's in budgets.yaml; the node-hours
    they leave (None: no budget), which a chain's links keep to."""
    from mmm_orch.records.usage import check_account_budget

    if checked.cost is None:
        return None
    left = check_account_budget(
        open_db(db), checked, checked.cost.most if most is None else most, what
    )
    limits = [value for value in (checked.cost.budget, left) if value is not None]
    return min(limits) if limits else None


def chain_links(checked: Plan, links: int) -> list[Plan]:
    """The plans of a chain's links as a review shows them (the chain's directory and run name
    are known once it is submitted); refused when the chain cannot work."""
    from mmm_orch.injob.protocol import CHAIN_FILE
    from mmm_orch.submission.chains import link_plans

    return link_plans(
        checked,
        links,
        f"<chain dir>/{CHAIN_FILE}",
        checked.launch.args.get("run_name") or f"{checked.name}-<tag>",
        checked.launch.workdir,
    )


def ready(
    checked: Plan,
    template: str | None,
    remote: str,
    env_check: bool,
    scripts: list[Plan] | None = None,
    budget: float | None = None,
) -> Prepared:
    from mmm_orch.submission.preflight import check_job_python

    for each in [checked] if scripts is None else scripts:  # a bad template is refused before
        render(each, template)  # the machine is contacted
    if env_check:
        check_job_python(checked, remote)
    return Prepared(checked, template, remote, budget)


def submit(prepared: Prepared, db: str | None = None, backlog: bool = False) -> JobRecord:
    """Submit the prepared job; with `backlog`, record it waiting and move the backlog (it is
    submitted now if its queue has room)."""
    from mmm_orch.submission import submit as jobs

    record = jobs.submit(
        prepared.plan, db_path(db), prepared.template, remote=prepared.remote, backlog=backlog
    )
    if backlog:
        moved(db)
    return record if not backlog else open_db(db, create=True).get_existing(record.id)


def moved(db: str | None = None):
    """The backlog moved now (usecases/backlogs.py): what it submitted and says."""
    from mmm_orch.usecases.backlogs import move

    return move(open_db(db, create=True))


def submit_chain(
    prepared: Prepared, links: int, db: str | None = None, backlog: bool = False
) -> list[JobRecord]:
    """Submit the chain's links (`backlog`: recorded waiting, the backlog then moved)."""
    from mmm_orch.submission.chains import submit_chain as submit_links

    records = submit_links(
        prepared.plan,
        db_path(db),
        links,
        prepared.template,
        prepared.remote,
        prepared.budget,
        backlog,
    )
    if not backlog:
        return records
    moved(db)
    opened = open_db(db, create=True)
    return [opened.get_existing(r.id, events=False) for r in records]


def sweep_points(
    request: Request,
    nodes: str | None,
    sets: list[str],
    db: str | None = None,
    template: str | None = None,
    host: str | None = None,
    review: bool = False,
    devices: str | None = None,
    within: bool = False,
    backlog: bool = False,
):
    """The sweep's axes and every point planned, each point's script rendered once to check it.
    `request` carries what all points share (its nodes and --set come from the axes). Where the
    points' queues have job limits, the user's jobs are counted where the sweep goes (`review`:
    offline, as `plan` does) and each point takes a queue with room for it; with `backlog` they
    are not counted: the points wait for room in the backlog. Points on some devices of a node
    (`devices`) only run side by side in one allocation (`within`)."""
    from mmm_orch.submission import queue_load, sweeps

    if devices is not None and not within:
        raise InvalidValue(
            "--devices",
            devices,
            "only with --pack or --within (runs side by side "
            "on one node's devices; a job of its own holds whole nodes)",
        )
    swept = sweeps.axes(nodes, sets, devices)
    shared = dataclasses.replace(request, avoid_nodes=bad_nodes(db, request.machine))
    try:
        planned = sweeps.points(shared, swept, new_jobs=not backlog)
        limited = next((p.plan for p in planned if queue_load.limits_apply(p.plan)), None)
        if limited is not None and request.queue_load is None and not backlog:
            remote = None if review else target(request.machine, host)
            load = queue_load.read(limited, remote, open_db(db))
            planned = sweeps.points(dataclasses.replace(shared, queue_load=load), swept)
    except QueueFull as exc:
        raise QueueFull(f"{exc}; {_in_one_allocation(shared, swept)}") from None
    for point in planned:  # a bad template is refused before the machine is contacted
        render(point.plan, template)
    plans = [point.plan for point in planned]
    what = f"the sweep's {len(plans)} points"
    priced = plans[0].cost
    assert priced is not None  # resolve prices every plan it makes (only old records lack it)
    cost.check_max(what, cost.sweep_most(plans), priced.budget, priced.unit)
    within_budgets(plans[0], db, what, cost.sweep_most(plans))
    return swept, planned


def _in_one_allocation(shared: Request, swept: dict[str, list[str]]) -> str:
    """The other way for a sweep the queues cannot take: its points side by side in one
    allocation as large as its largest point, long enough for the waves the points run in at
    most: a job of its own (`sweep --pack`) or one the user gets (`sweep --within`); what that
    allocation asks for, and the command that gets it."""
    from mmm_orch.submission import sweeps
    from mmm_orch.submission.launch import allocation_hint
    from mmm_orch.submission.pack import walltime_for
    from mmm_orch.walltime import format_walltime

    points = sweeps.points(shared, swept, new_jobs=False)
    nodes = max(point.nodes for point in points)
    walltime = format_walltime(walltime_for(points, nodes))
    what = (
        f"or run the {len(points)} points side by side in one job of {nodes} node"
        f"{'s' if nodes > 1 else ''} for {walltime}"
    )
    try:
        whole = resolve(dataclasses.replace(shared, nodes=nodes, walltime=walltime, queue=None))
    except MmmError:
        return f"{what}, which no queue of {shared.machine} takes"
    cost = f" (at most {whole.cost.most:.2f} {whole.cost.unit})" if whole.cost else ""
    return (
        f"{what}{cost}: submit it with --pack, or get the allocation with "
        f"`{allocation_hint(whole)}` and run this sweep in it with --within"
    )


def submit_sweep(
    swept,
    planned,
    db: str | None = None,
    template: str | None = None,
    host: str | None = None,
    env_check: bool = True,
    backlog: bool = False,
) -> tuple[int, list[JobRecord], tuple[str, ...]]:
    """Submit planned points (sweep_points) as one sweep: all of them, or none (`backlog`: all
    recorded waiting, then the backlog moved); with the notes on their stacks (check_stacks)
    for the caller to say once they are submitted."""
    from mmm_orch.submission import sweeps
    from mmm_orch.submission.preflight import check_job_python, target_for

    remote = target_for(planned[0].plan, host)
    notes = check_stacks([point.plan for point in planned])
    if env_check:
        check_job_python(planned[0].plan, remote)
    sweep_id, records = sweeps.submit_sweep(swept, planned, db_path(db), template, remote, backlog)
    if backlog:
        moved(db)
        opened = open_db(db, create=True)
        records = [opened.get_existing(r.id, events=False) for r in records]
    return sweep_id, records, notes


def resuming(planned: Plan, allow_fresh: bool = False) -> Plan:
    """`planned` going on from its run's latest checkpoint (`rerun --resume`); `allow_fresh`:
    from the start where the run saved none."""
    if not planned.launch.can_resume:
        raise MmmError(
            f"rerun --resume: workload {planned.workload} cannot resume "
            f"({planned.launch.why_it_cannot_resume})"
        )
    return planned.with_launch(
        args={**planned.launch.args, "resume": True, "allow_fresh": allow_fresh}
    )


def cancel(db: JobDB, records: list[JobRecord], sweep: int | None = None) -> Iterator[str]:
    """Cancel `records` and every job of `sweep` (of a pack: its job, which stops its points
    itself and records those waiting as not started); a link of a chain takes the whole chain
    with it. Yields what happened to each job, in words, as it happens."""
    from mmm_orch.progress.refresh import refresh
    from mmm_orch.submission.submit import cancel as send_cancel

    records = list(records)
    if sweep is not None:
        from mmm_orch.submission.sweeps import pack_job, sweep_jobs

        named = {r.id for r in records}
        sweep_group, points = sweep_jobs(db, sweep)
        pack = pack_job(db, sweep_group)
        whole = [pack] if pack is not None and not pack.terminal else points
        records += [r for r in whole if r.id not in named]
    for record in list(records):
        if (
            record.group_id is not None
            and (group := db.groups.get(record.group_id))
            and group["kind"] == "chain"
        ):
            links = [
                r for r in db.list(group_id=record.group_id) if r.id not in {x.id for x in records}
            ]
            yield (
                f"job {record.id} is link {record.group_index} of chain {record.group_id}: "
                "cancelling every link"
            )
            records += links
    withdrawn = set()
    for record in records:  # first: before a mover submits them
        if record.state is JobState.WAITING and db.backlog.withdraw(
            record.id, "taken out of the backlog by cancel: never submitted"
        ):
            withdrawn.add(record.id)
            yield f"job {record.id}: taken out of the backlog, never submitted"
    records = [r for r in records if r.id not in withdrawn]
    outcome = refresh(db, records)
    for record in records:
        if record.id in outcome.removed:
            yield f"job {record.id}: never reached {record.scheduler}; record removed"
            continue
        found = db.get(record.id, events=False)
        if found is None:  # removed meanwhile by another mmm-orch: only a record never submitted is
            yield f"job {record.id}: never reached {record.scheduler}; record removed"
            continue
        record = found
        if record.terminal:
            yield f"job {record.id} already {record.state.value}"
            continue
        if not record.native_id:
            yield (
                f"job {record.id}: still submitting; cancel it once `mmm-orch status` shows "
                "its scheduler id"
            )
            continue
        send_cancel(db, record)
        refresh(db, [record])
        now = db.get_existing(record.id, events=False)
        yield (
            f"job {record.id}: cancel sent ({record.scheduler} id {record.native_id}); "
            f"state {now.state.value}"
        )
