"""mmm-orch from Python: plan, render, submit, sweep, look up, wait for and report on jobs.

    import mmm_orch

    job = mmm_orch.submit("slurm-local", "fsdp_tp", nodes=2, options={"tp": 2})
    job.wait()
    print(job.state, job.exit_code, job.logs(tail=20))

Each call goes through the same use cases as the command line (usecases.py, inspection.py), so
it plans, checks, records and refreshes exactly as `mmm-orch submit`, `status`, `logs` and
`report` do. Bad input raises before anything is written: every error is an MmmError whose `str`
is the command line's one-line message; a bad value raises InvalidValue (UnknownName for a name
that does not exist) carrying `field`, `value` and `allowed`. Calls are safe from several
threads (they take turns with the process's one database connection) and processes (SQLite's
locks, as for the CLI).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from mmm_orch.api_job import Job, lock, refresh
from mmm_orch.errors import InvalidValue
from mmm_orch.limits import MAX_LINKS
from mmm_orch.planning.model import Plan, Request

__all__ = ["Job", "Sweep", "balance", "job", "jobs", "plan", "refresh", "render", "report",
           "submit", "sweep", "usage"]


@dataclass(frozen=True)
class PlanOptions:
    """What makes a plan, as the command line's options do (`--nodes`, `--set`, `--env`, ...)."""

    machine: str
    workload: str | None = None
    command: Sequence[str] | None = None  # your own program, in place of a trainer (after --)
    nodes: int | None = None
    queue: str | None = None
    walltime: str | None = None  # HH:MM:SS
    account: str | None = None
    name: str | None = None
    options: Mapping[str, Any] | None = None  # the trainer's options (--set)
    env: Mapping[str, str] | None = None  # extra variables for the job (--env)
    presets: Iterable[str] = ()
    no_presets: Iterable[str] = ()
    spare_nodes: int = 0
    stage_env: bool = False
    workdir: str | None = None
    max_node_hours: float | None = None  # the budget: a costlier plan (sweep, chain) is refused

    def __post_init__(self) -> None:
        """Python's types where the command line's parser would check them: a wrong type is an
        InvalidValue, never a TypeError from deep inside."""
        _of("machine", self.machine, str)
        for name in ("workload", "queue", "walltime", "account", "name", "workdir"):
            _of(name, getattr(self, name), str, none=True)
        if self.nodes is not None:
            _count("nodes", self.nodes, 1)
        _count("spare_nodes", self.spare_nodes, 0)
        _of("stage_env", self.stage_env, bool)
        if self.max_node_hours is not None and (isinstance(self.max_node_hours, bool) or
                                                not isinstance(self.max_node_hours, (int, float))):
            raise InvalidValue("max_node_hours", self.max_node_hours, "a positive number or None")
        for name in ("options", "env"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, Mapping)
                                      or not all(isinstance(k, str) for k in value)):
                raise InvalidValue(name, value, "a mapping of names (str) to values")
        for name in ("presets", "no_presets", "command"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, (str, bytes))
                                      or not all(isinstance(v, str) for v in value)):
                raise InvalidValue(name, value, "a list of str, e.g. " + (
                    "['python3', '-m', 'mypkg.train']" if name == "command" else "['nccl-ofi']"))

    def request(self, swept: bool = False) -> Request:
        if self.workload is None and not self.command:
            raise InvalidValue("workload", None, "a workload's name, or command=[...]",
                               "workload is missing: name one (`mmm-orch workloads`), or give "
                               "your own command: command=['python3', '-m', 'mypkg.train'], as "
                               "after -- on the command line")
        return Request(
            machine=self.machine, workload=self.workload or "command",
            command=tuple(self.command or ()), nodes=None if swept else self.nodes,
            queue=self.queue, walltime=self.walltime, account=self.account, name=self.name,
            sets=() if swept else tuple(f"{k}={_word(v)}" for k, v in (self.options or {}).items()),
            envs=tuple(f"{k}={v}" for k, v in (self.env or {}).items()),
            presets=tuple(self.presets), no_presets=tuple(self.no_presets),
            spare_nodes=self.spare_nodes, stage_env=self.stage_env, workdir=self.workdir,
            max_node_hours=self.max_node_hours)


def _of(name: str, value: Any, kind: type, none: bool = False) -> None:
    if not (isinstance(value, kind) or (none and value is None)):
        raise InvalidValue(name, value, f"a {kind.__name__}" + (" or None" if none else ""))


def _count(name: str, value: Any, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or \
            (high is not None and value > high):
        raise InvalidValue(name, value, f"a whole number {low}-{high}" if high is not None
                           else f"a whole number >= {low}")


def _word(value: Any) -> str:
    """A value as the command line spells it (`--set steps=10`, `--set compile=true`)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def plan(machine: str, workload: str | None = None, *, db: str | None = None,
         **options: Any) -> Plan:
    """The validated, immutable plan (what `mmm-orch render` shows); nothing is written.
    Keyword options: those of PlanOptions."""
    from mmm_orch import usecases

    request = PlanOptions(machine, workload, **options).request()
    with lock:
        return usecases.plan(request, db)


def render(machine: str, workload: str | None = None, *, template: str | None = None,
           db: str | None = None, **options: Any) -> str:
    """The job script the plan would submit, for review."""
    from mmm_orch import usecases

    request = PlanOptions(machine, workload, **options).request()
    with lock:
        return usecases.script(request, db, template)


def submit(machine: str | Plan, workload: str | None = None, *, chain: int = 0,
           host: str | None = None, template: str | None = None, env_check: bool = True,
           db: str | None = None, **options: Any) -> Job | list[Job]:
    """Submit as `mmm-orch submit` does and return the Job; with `chain=N`, the N links' Jobs.
    `machine` may be a plan made by `plan()`: what was reviewed is what is submitted, and a loop
    that submits one plan many times plans once. `host`: a login host to submit through over
    SSH. The job is recorded before the scheduler is asked: a process killed meanwhile leaves a
    record the next refresh settles."""
    from mmm_orch import usecases

    if chain:
        _count("chain", chain, 1, MAX_LINKS)
    if isinstance(machine, Plan):
        if workload is not None or options:
            given = "workload" if workload is not None else sorted(options)[0]
            raise InvalidValue(given, workload if workload is not None else options[given],
                               "nothing beside a plan: its options were fixed by plan()")
        request = None
    else:
        request = PlanOptions(machine, workload, **options).request()
    with lock:
        prepared = (usecases.prepare(request, db, template, host, env_check, chain) if request
                    else usecases.prepare_plan(machine, template, host, env_check, chain, db))
        if chain:
            return [Job(record, db) for record in usecases.submit_chain(prepared, chain, db)]
        return Job(usecases.submit(prepared, db), db)


@dataclass(frozen=True)
class Sweep:
    id: int
    jobs: list[Job]
    points: list[dict[str, Any]]  # each job's values of the swept options (nodes included)


def sweep(machine: str, workload: str | None = None, *, nodes: Sequence[int] | None = None,
          grid: Mapping[str, Sequence[Any]] | None = None, host: str | None = None,
          template: str | None = None, env_check: bool = True, db: str | None = None,
          **options: Any) -> Sweep:
    """Submit every point of `nodes` x `grid` (option -> values) as one sweep, all or none, as
    `mmm-orch sweep --nodes 1,2 --set lr=1e-3,3e-4` does; fixed `options` apply to every
    point."""
    from mmm_orch import usecases

    fixed = PlanOptions(machine, workload, **options)
    if nodes is not None and (isinstance(nodes, (str, bytes)) or not nodes):
        raise InvalidValue("nodes", nodes, "a non-empty list of node counts, e.g. [1, 2, 4]")
    if grid is not None and not isinstance(grid, Mapping):
        raise InvalidValue("grid", grid, "a mapping of option names to lists of values")
    for key, values in (grid or {}).items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise InvalidValue(f"grid {key}", values, "a list of values, e.g. [1e-3, 3e-4]")
    axes = [f"{key}={','.join(_word(v).replace(',', chr(92) + ',') for v in values)}"
            for key, values in {**{k: [v] for k, v in (fixed.options or {}).items()},
                                **(grid or {})}.items()]
    swept_nodes = ",".join(str(n) for n in nodes) if nodes is not None else (
        str(fixed.nodes) if fixed.nodes is not None else None)
    with lock:
        swept, planned = usecases.sweep_points(fixed.request(swept=True), swept_nodes, axes, db,
                                               template)
        sweep_id, records = usecases.submit_sweep(swept, planned, db, template, host, env_check)
    return Sweep(sweep_id, [Job(r, db) for r in records], [p.values for p in planned])


def job(job_id: int, db: str | None = None) -> Job:
    """An earlier job, by its id (as `mmm-orch status` shows it), from this process or another."""
    from mmm_orch.errors import MmmError
    from mmm_orch.jobs.db import open_db

    with lock:
        opened = open_db(db)
        record = opened.get(job_id, events=False) if opened is not None else None
    if record is None:
        raise MmmError(f"job {job_id} not found")
    return Job(record, db)


def jobs(machine: str | None = None, state: str | None = None, sweep: int | None = None,
         limit: int | None = None, db: str | None = None) -> list[Job]:
    """Recorded jobs, newest last: of a machine, in a state (as last refreshed), of a sweep."""
    from mmm_orch.jobs.db import open_db
    from mmm_orch.jobs.sweeps import sweep_jobs
    from mmm_orch.schedulers.states import JobState

    if state is not None and state not in {s.value for s in JobState}:
        raise InvalidValue("state", state, "one of " + ", ".join(s.value for s in JobState))
    with lock:
        opened = open_db(db)
        if opened is None:
            return []
        records = sweep_jobs(opened, sweep)[1] if sweep is not None else \
            sorted(opened.list(machine=machine, limit=limit), key=lambda r: r.id)
    return [Job(r, db) for r in records if (machine is None or r.machine == machine)
            and (state is None or r.state.value == state)]


def report(targets: Sweep | Iterable[Job], out: str | Path | None = None) -> list[dict[str, Any]]:
    """The report's rows, one per job (step time, per-device throughput, MFU, startup, scaling
    efficiency), as `mmm-orch report` computes them; with `out`, also its directory of figures
    (where matplotlib is installed) and report.html."""
    from mmm_orch.api_job import _db
    from mmm_orch.reporting import build, table

    chosen = targets.jobs if isinstance(targets, Sweep) else list(targets)
    values = targets.points if isinstance(targets, Sweep) else None
    title = f"sweep {targets.id}" if isinstance(targets, Sweep) else \
        "jobs " + ", ".join(str(each.id) for each in chosen)
    with lock:
        records = [_db(each.db).get(each.id, events=False) or each.record for each in chosen]
        made = build.report(records, values, None if out is None else Path(out), title)
    return table.as_dicts(made.rows)


def usage(machine: str | None = None, account: str | None = None, since: str | None = None,
          by: str | None = None, db: str | None = None) -> list[dict[str, Any]]:
    """What the recorded jobs were charged, as `mmm-orch usage` sums it: one dict per machine,
    account (and workload, sweep, chain or day with `by`); open jobs are refreshed first."""
    from mmm_orch import usecases
    from mmm_orch.jobs.db import open_db
    from mmm_orch.jobs.usage import as_dicts

    with lock:
        rows, _ = usecases.usage(open_db(db), machine, account, since, by)
    return as_dicts(rows)


def balance(machine: str, account: str | None = None, host: str | None = None) -> dict[str, Any]:
    """The project's allocations and what remains, from the facility's tool (`mmm-orch balance`);
    where it cannot tell, no allocations and a `note` saying why."""
    from mmm_orch.allocations import balance as ask

    return ask(machine, account, host).to_dict()
