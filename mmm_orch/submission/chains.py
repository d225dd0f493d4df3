"""Chains: one training run carried across walltimes by up to N jobs, link k+1 waiting on link k
through the scheduler's own dependency (`afterany`) and resuming from the run's latest checkpoint.
The decisions (go on, finished, no progress) are made inside the jobs by mmm_orch.injob.chain, so a
chain keeps going with the submitting laptop closed; this module submits the links and reads the
chain's state back for `status`."""

from __future__ import annotations

import dataclasses
import posixpath
from pathlib import Path
from typing import Any

from mmm_orch.errors import MmmError
from mmm_orch.hosts import host_for
from mmm_orch.injob import files, protocol
from mmm_orch.injob.files import ChainBudget, ChainState
from mmm_orch.injob.protocol import CHAIN_FILE
from mmm_orch.planning.model import ChainLink, Plan
from mmm_orch.records.db import JobDB, open_db
from mmm_orch.records.dbfile import jobs_root_for
from mmm_orch.records.record import JobRecord
from mmm_orch.schedulers import scheduler_for, scheduler_kind
from mmm_orch.schedulers.base import CommandScheduler
from mmm_orch.schedulers.states import JobState
from mmm_orch.submission.submit import cancel, new_tag, submit


def check(plan: Plan, links: int) -> None:
    """Refuse a chain that cannot work, before anything is written."""
    if not scheduler_kind(plan.scheduler).batch:
        raise MmmError(
            f"--chain {links}: machine {plan.machine} runs jobs at once, without a "
            "scheduler to hold the next link until the one before ends"
        )
    if not plan.launch.can_resume:
        raise MmmError(
            f"--chain {links}: workload {plan.workload} has no run to carry on "
            f"({plan.launch.why_it_cannot_resume})"
        )


def link_plans(plan: Plan, links: int, chain_file: str, run_name: str, workdir: str) -> list[Plan]:
    """The plan of every link: one run directory; the first link as asked, the others resuming
    (strictly: a link with nothing to resume from fails, and stops the chain)."""
    check(plan, links)
    args = {**plan.launch.args, "run_name": run_name}
    base = plan.with_launch(workdir=workdir)
    return [
        dataclasses.replace(
            base.with_launch(
                args=args if k == 1 else {**args, "resume": True, "allow_fresh": False}
            ),
            chain=ChainLink(file=chain_file, link=k, links=links),
        )
        for k in range(1, links + 1)
    ]


def submit_chain(
    plan: Plan,
    db_file: Path,
    links: int,
    template: str | None = None,
    remote: str = "",
    budget: float | None = None,
    backlog: bool = False,
) -> list[JobRecord]:
    """Submit the links (each with its own record, in one chain group) and write the chain's
    state where the jobs run; a refused link cancels those already submitted. `budget`: the
    node-hours the links may spend together (each link checks before it starts). `backlog`:
    every link recorded waiting, without a dependency: the backlog's mover submits each once
    the link before it ended (usecases/backlogs.py)."""
    host = host_for(remote)
    tag = new_tag()
    leaf = f"{tag}-chain-{plan.workload}"
    chain_dir = (
        posixpath.join(host.home(), plan.transport.remote_jobs_dir, leaf)
        if remote
        else str(jobs_root_for(db_file) / leaf)
    )
    chain_file = posixpath.join(chain_dir, CHAIN_FILE)
    # Links submitted over SSH run in the chain's directory (one run directory for all).
    workdir = chain_dir if remote and not plan.launch.workdir_given else plan.launch.workdir
    run_name = plan.launch.args.get("run_name") or f"{plan.name}-{tag}"
    plans = link_plans(plan, links, chain_file, run_name, workdir)
    db = open_db(str(db_file), create=True)
    assert db is not None
    scheduler = scheduler_for(plan.scheduler, plan.scheduler_commands, host)
    created = host.make_private_dir(chain_dir)
    run_dir = plans[0].launch.run_dir
    assert isinstance(scheduler, CommandScheduler)  # (check(): a batch scheduler)
    host.write_file(
        chain_file,
        ChainState(
            links, run_dir, (scheduler.cmd["cancel"],), budget=_budget(plan, budget)
        ).to_json(),
        0o600,
    )
    chain_id = db.groups.new(
        "chain",
        {
            "links": links,
            "dir": chain_dir,
            "remote": remote,
            "run_dir": run_dir,
            "tag": tag,
            "steps": plan.launch.args.get("steps"),
        },
    )
    records: list[JobRecord] = []
    try:
        for link in plans:
            if not backlog:
                link = link.waiting_for(records[-1].native_id if records else "")
            record = submit(
                link,
                db_file,
                template,
                remote,
                links={"group_id": chain_id, "group_index": link.chain.link},
                backlog=backlog,
            )
            if not backlog:
                write_link_id(host, chain_dir, link.chain.link, record.native_id)
            records.append(record)
    except BaseException:
        for record in reversed(records):
            cancel(db, record)
        if not records:
            host.remove_tree(created)
        raise
    return records


def write_link_id(host, chain_dir: str, link: int, native_id: str) -> None:
    """The scheduler's id of link `link`, beside the chain's state (what the links cancel)."""
    host.write_file(posixpath.join(chain_dir, protocol.link_id_file(link)), native_id, 0o600)


def ready_link(db: JobDB, record: JobRecord) -> tuple[bool, str]:
    """Whether a chain's waiting link may be submitted now: (True, "") once every link before
    it ended and the chain goes on; (False, "") while one has not; (False, why) when the chain
    ended (finished or stopped), so that the link is never to run."""
    group = chain_of(db, record)
    if group is None:
        return True, ""
    before = [
        r for r in db.list(group_id=group["id"]) if (r.group_index or 0) < (record.group_index or 0)
    ]
    if not all(r.terminal for r in before):
        return False, ""
    try:
        state = read_state(group)
    except files.ProtocolFileError:
        state = None  # the links say it in their own logs when they begin
    if state is not None and state.status != "running":
        return False, f"the chain {state.status}" + (f" ({state.reason})" if state.reason else "")
    return True, ""


def _budget(plan: Plan, limit: float | None) -> ChainBudget | None:
    """What injob/chain.py needs to price the links against `limit` (the plan's rules)."""
    cost = plan.cost
    if limit is None or cost is None:
        return None
    return ChainBudget(
        limit=limit,
        nodes=cost.nodes,
        walltime=cost.walltime,
        factor=cost.factor,
        minimum=cost.minimum,
        charged_for=cost.charged_for,
        unit=cost.unit,
    )


def read_state(group: dict[str, Any]) -> ChainState | None:
    """The chain's state as its jobs left it (chain.json), or None where there is none to read
    (not written, the login host out of reach); files.ProtocolFileError where it is damaged."""
    spec = group["spec"]
    try:  # at most read_from's MiB: the jobs write a few hundred bytes
        text = host_for(spec["remote"]).read_from(posixpath.join(spec["dir"], CHAIN_FILE), 0)
    except (MmmError, OSError, TypeError, KeyError):
        return None  # TypeError, KeyError: a spec edited by hand (no dir, no remote)
    return ChainState.from_json(text) if text else None


def chain_of(db: JobDB, record: JobRecord) -> dict[str, Any] | None:
    if record.group_id is None:
        return None
    group = db.groups.get(record.group_id)
    return group if group and group["kind"] == "chain" else None


def summary(group: dict[str, Any], links: list[JobRecord]) -> dict[str, Any]:
    """A chain as one line of `status`: its state, how many links ran, where the run is."""
    # chain.json is written by the jobs: what is not as they write it is said, never a crash.
    damaged = ""
    try:
        state = read_state(group)
    except files.ProtocolFileError as exc:
        state, damaged = None, files.unreadable(CHAIN_FILE, exc, "the jobs write")
    steps = [
        v
        for p in (state.progress.values() if state else ())
        for v in (p.end_step, p.start_step)
        if v is not None
    ]
    done = sum(1 for link in links if link.terminal)
    current = next((link for link in links if not link.terminal), links[-1])
    status = state.status if state else "running"
    reason = state.reason if state else ""
    if not current.terminal:  # a link still open: the chain is as that link is
        overall = current.state
    elif status == "finished":
        overall = JobState.COMPLETED
    elif all(link.state is JobState.CANCELLED for link in links if link.terminal) and done == len(
        links
    ):
        overall = JobState.CANCELLED
    elif status == "stopped":  # a budget's stop is the user's own limit, not a failure
        overall = (
            JobState.CANCELLED if reason.startswith(protocol.CHAIN_BUDGET) else JobState.FAILED
        )
    else:
        overall = JobState.PENDING
    note = f"links {done}/{group['spec'].get('links', '?')}"
    if steps:
        note += f", step {max(steps)}"
        if group["spec"].get("steps"):
            note += f"/{group['spec']['steps']}"
    if reason or damaged:
        note += f": {(reason or damaged)[:200]}"
    return {
        "state": overall,
        "current": current,
        "note": note,
        "elapsed": sum(link.elapsed() or 0 for link in links) or None,
    }
