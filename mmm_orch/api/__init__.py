"""mmm-orch from Python: plan, render, submit, sweep, look up, wait for and report on jobs.

    import mmm_orch

    job = mmm_orch.submit("slurm-local", "fsdp_tp", nodes=2, options={"tp": 2})
    job.wait()
    print(job.state, job.exit_code, job.logs(tail=20))

Each call goes through the same use cases as the command line (usecases/, usecases/inspection.py), so
it plans, checks, records and refreshes exactly as `mmm-orch submit`, `status`, `logs` and
`report` do. Bad input raises before anything is written: every error is an MmmError whose `str`
is the command line's one-line message; a bad value raises InvalidValue (UnknownName for a name
that does not exist) carrying `field`, `value` and `allowed`. Calls are safe from several
threads (they take turns with the process's one database connection) and processes (SQLite's
locks, as for the CLI).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmm_orch import usecases
from mmm_orch.api.handles import (
    Job,
    flag_of,
    items_of,
    jobs_of,
    lock,
    name_of,
    number_of,
    opened,
    path_of,
    refresh,
    text_of,
    whole_of,
)
from mmm_orch.errors import InvalidValue, MmmError
from mmm_orch.options.plan import option_fields
from mmm_orch.usecases import (
    MAX_INT,
    MAX_LINKS,
    JobState,
    Plan,
    Request,
    allocations,
    backlogs,
    following,
    packs,
    reports,
)

__all__ = [
    "Allocation",
    "Job",
    "allocate",
    "allocation",
    "Sweep",
    "backlog",
    "balance",
    "job",
    "jobs",
    "plan",
    "refresh",
    "render",
    "report",
    "submit",
    "sweep",
    "usage",
]


def _words(field: str, value: Any, example: str) -> tuple[str, ...]:
    return tuple(text_of(field, word) for word in items_of(field, value, "str", example))


def _keyed(field: str, value: Any, example: str) -> dict[str, Any]:
    """A mapping of names to values, each name made plain; a name with '=' is refused, as the
    command line's KEY=VALUE would split it elsewhere."""
    if not isinstance(value, Mapping):
        raise InvalidValue(field, value, f"a mapping of names (str) to values, e.g. {example}")
    plain = {}
    for key, each in value.items():
        if not isinstance(key, str) or "=" in key:
            raise InvalidValue(field, key, "names (str) without '=' as keys")
        plain[str.__str__(key)] = each
    return plain


def _setting(field: str, value: Any) -> bool | int | float | str:
    """A trainer option's value: a bool, int, float or str (which type the option takes is
    checked once planned, by _typed)."""
    if isinstance(value, bool):
        return value
    # As plain numbers, whatever a caller's int or float subclass would do in their place
    if isinstance(value, int) and -MAX_INT <= int.__int__(value) <= MAX_INT:
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, str):
        return str.__str__(value)
    raise InvalidValue(field, value, "a bool, int (below 2**63), float or str")


def _settings(field: str, value: Any) -> dict[str, Any]:
    return {
        key: _setting(f"{field} {key}", each)
        for key, each in _keyed(field, value, "{'steps': 10}").items()
    }


def _trainer_options(field: str, value: Any) -> tuple[tuple[str, Any], ...]:
    return () if value is None else tuple(_settings(field, value).items())


def _variables(field: str, value: Any) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    named = _keyed(field, value, "{'NCCL_DEBUG': 'INFO'}")
    return tuple((key, text_of(f"{field} {key}", each)) for key, each in named.items())


def _command(field: str, value: Any) -> tuple[str, ...]:
    return () if value is None else _words(field, value, "['python3', '-m', 'mypkg.train']")


# Each kind of plan option (mmm_orch/options/plan.py) as a keyword: what it takes, in Python's
# types (as the reference shows them), and its value made plain where the command line's parser
# would check it: a wrong type is an InvalidValue, never a TypeError from deep inside. What a
# name or a walltime may say, planning checks, in the command line's words.
KEYWORD_KINDS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "text": ("str | None", lambda field, value: text_of(field, value, none=True)),
    "count": ("int | None", lambda field, value: whole_of(field, value, 1, none=True)),
    "spare": ("int", lambda field, value: whole_of(field, value, 0)),
    "flag": ("bool", flag_of),
    "budget": ("float | None", lambda field, value: number_of(field, value, none=True)),
    "names": ("Iterable[str]", lambda field, value: _words(field, value, "['nccl-ofi']")),
    "settings": ("Mapping[str, bool | int | float | str] | None", _trainer_options),
    "variables": ("Mapping[str, str] | None", _variables),
    "words": ("Sequence[str] | None", _command),
}


_PYTHON_TYPES = {
    "bool": ((bool,), "True or False"),
    "int": ((int,), "an int"),
    "float": ((int, float), "an int or float"),
    "str": ((str,), "a str"),
    "choice": ((str,), "a str"),
}


def _typed(workload: str, field: str, given: Mapping[str, Sequence[Any]]) -> None:
    """Each option given a value of its Python type: planning reads text as the option's type
    too (the command line's 'yes' is a bool, '10' an int); from Python those are mistakes."""
    options = usecases.options_of(workload)
    for key, values in given.items():
        kinds, allowed = _PYTHON_TYPES[options[key].type]
        for value in values:
            # (isinstance counts a bool as an int)
            if isinstance(value, bool) != (kinds == (bool,)) or not isinstance(value, kinds):
                raise InvalidValue(
                    f"{field} {key}",
                    value,
                    allowed
                    + (f", {options[key].allowed()}" if options[key].type == "choice" else ""),
                )


def _word(value: bool | int | float | str) -> str:
    """A value as the command line spells it (`--set steps=10`, `--set compile=true`)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _request(machine: Any, workload: Any, keywords: dict[str, Any]) -> Request:
    """The Request a call's keywords ask for, each a plan option made plain by its kind: an
    unknown one is an UnknownName, as a misspelt option is on the command line."""
    known = {option.name: option.metadata["kind"] for option in option_fields()}
    for key in keywords:
        if key not in known:
            raise usecases.unknown_name("keyword", key, list(known))
    machine = text_of("machine", machine)
    workload = text_of("workload", workload, none=True)
    plain = {key: KEYWORD_KINDS[known[key]][1](key, value) for key, value in keywords.items()}
    if workload is None and not plain.get("command"):
        raise InvalidValue(
            "workload",
            None,
            "a workload's name, or command=[...]",
            "workload is missing: name one (`mmm-orch workloads`), or give "
            "your own command: command=['python3', '-m', 'mypkg.train'], as "
            "after -- on the command line",
        )
    return Request(machine, workload or "command", **plain)


def _planned(request: Request, db: str | None) -> Plan:
    made = usecases.plan(request, db)
    _typed(made.workload, "options", {key: [value] for key, value in request.options})
    return made


def plan(
    machine: str, workload: str | None = None, *, db: str | None = None, **options: Any
) -> Plan:
    """The validated, immutable plan (what `mmm-orch render` shows); nothing is written.
    Keyword options: the plan options (mmm_orch.options.plan.PlanOptions) beside the machine
    and the workload."""
    chosen, db = _request(machine, workload, options), path_of("db", db, none=True)
    with lock:
        return _planned(chosen, db)


def render(
    machine: str,
    workload: str | None = None,
    *,
    template: str | None = None,
    db: str | None = None,
    **options: Any,
) -> str:
    """The job script the plan would submit, for review."""
    chosen, db = _request(machine, workload, options), path_of("db", db, none=True)
    template = path_of("template", template, none=True)
    with lock:
        return usecases.render(_planned(chosen, db), template)


def submit(
    machine: str | Plan,
    workload: str | None = None,
    *,
    chain: int = 0,
    host: str | None = None,
    template: str | None = None,
    env_check: bool = True,
    db: str | None = None,
    backlog: bool = False,
    **options: Any,
) -> Job | list[Job]:
    """Submit as `mmm-orch submit` does and return the Job; with `chain=N`, the N links' Jobs.
    `machine` may be a plan made by `plan()`: what was reviewed is what is submitted, and a loop
    that submits one plan many times plans once. `host`: a login host to submit through over
    SSH. The job is recorded before the scheduler is asked: a process killed meanwhile leaves a
    record the next refresh settles. `backlog`: what the queue's job limits do not admit now
    waits in the backlog (state "waiting"), submitted as they do: each Job's wait() and
    refresh() move it, as backlog() and `mmm-orch status` do."""

    chain = whole_of("chain", chain, 0, MAX_LINKS)  # 0: one job, no chain
    backlog = flag_of("backlog", backlog)
    host, env_check = name_of("host", host, none=True), flag_of("env_check", env_check)
    template, db = path_of("template", template, none=True), path_of("db", db, none=True)
    if isinstance(machine, Plan):
        if workload is not None or options:
            given = "workload" if workload is not None else sorted(options)[0]
            raise InvalidValue(
                given,
                workload if workload is not None else options[given],
                "nothing beside a plan: its options were fixed by plan()",
            )
        chosen = None
    else:
        chosen = _request(machine, workload, options)
    with lock:
        if isinstance(machine, Plan):
            checked = machine
        else:
            assert chosen is not None  # made above for a machine's name
            if backlog:  # its runs wait for room: the queue's jobs are not counted
                chosen = dataclasses.replace(chosen, queue_load=usecases.NOTHING_YET)
            checked = _planned(chosen, db)
        prepared = usecases.prepare_plan(
            checked, template, host, env_check, chain, db, backlog=backlog
        )
        if chain:
            links = [
                Job(record, db)
                for record in usecases.submit_chain(prepared, chain, db, backlog=backlog)
            ]
        else:
            made = Job(usecases.submit(prepared, db, backlog=backlog), db)
    _warn(prepared.notes)
    return links if chain else made


def _warn(notes: tuple[str, ...]) -> None:
    """A submission's notes (a stack not checked lately), as Python warnings to the caller."""
    for note in notes:
        warnings.warn(f"mmm-orch: {note}", stacklevel=3)


@dataclass(frozen=True)
class Sweep:
    """A sweep's points, submitted together (`sweep()`); `mmm-orch status --sweep ID` shows it."""

    id: int
    jobs: list[Job]
    points: list[dict[str, Any]]  # each job's values of the swept options (nodes included)
    # With pack=True: the one job whose allocation runs the points; they are recorded, and so
    # in `jobs`, as they start in it (mmm-orch status --sweep ID lists them).
    pack: Job | None = None


def sweep(
    machine: str,
    workload: str | None = None,
    *,
    nodes: Sequence[int] | None = None,
    grid: Mapping[str, Sequence[Any]] | None = None,
    host: str | None = None,
    template: str | None = None,
    env_check: bool = True,
    db: str | None = None,
    pack: bool = False,
    pack_nodes: int | None = None,
    pack_walltime: str | None = None,
    devices: Sequence[int] | None = None,
    backlog: bool = False,
    **options: Any,
) -> Sweep:
    """Submit every point of `nodes` x `grid` (option -> values) as one sweep, all or none, as
    `mmm-orch sweep --nodes 1,2 --set lr=1e-3,3e-4` does; fixed `options` apply to every
    point. `pack`: one job runs them all side by side (`sweep --pack`, `--pack-nodes`,
    `--pack-walltime`); `devices`: with `pack`, points on that many devices of one node each,
    besides those of `nodes` (`--devices`). `backlog`: the points the queue's job limits do not
    admit now wait in the backlog, as submit(backlog=True)'s."""

    backlog = flag_of("backlog", backlog)
    fixed = _request(machine, workload, options)
    # What every point shares: its nodes and the options fixed come from the axes.
    shared = dataclasses.replace(fixed, nodes=None, options=())
    host, env_check = name_of("host", host, none=True), flag_of("env_check", env_check)
    template, db = path_of("template", template, none=True), path_of("db", db, none=True)
    swept_nodes = None if fixed.nodes is None else str(fixed.nodes)
    if nodes is not None:
        counts = [
            whole_of("nodes", n, 1) for n in items_of("nodes", nodes, "node counts", "[1, 2, 4]")
        ]
        if not counts:
            raise InvalidValue("nodes", nodes, "a non-empty list of node counts, e.g. [1, 2, 4]")
        swept_nodes = ",".join(map(str, counts))
    swept_devices = None
    if devices is not None:
        counts = [
            whole_of("devices", n, 1)
            for n in items_of("devices", devices, "device counts", "[1, 2]")
        ]
        if not counts:
            raise InvalidValue("devices", devices, "a non-empty list of device counts, e.g. [1, 2]")
        if not flag_of("pack", pack):
            raise InvalidValue(
                "devices",
                devices,
                "only with pack=True (runs side by side on one "
                "node's devices; a job of its own holds whole nodes)",
            )
        swept_devices = ",".join(map(str, counts))
    grid = (
        {}
        if grid is None
        else {
            key: [
                _setting(f"grid {key}", v)
                for v in items_of(f"grid {key}", values, "values", "[1e-3, 3e-4]")
            ]
            for key, values in _keyed("grid", grid, "{'lr': [1e-3, 3e-4]}").items()
        }
    )
    for key, values in grid.items():
        if not values:
            raise InvalidValue(
                f"grid {key}", values, "a non-empty list of values, e.g. [1e-3, 3e-4]"
            )
    fixed_values = {key: [value] for key, value in fixed.options}
    axes = [
        f"{key}={','.join(_word(v).replace(',', chr(92) + ',') for v in values)}"
        for key, values in {**fixed_values, **grid}.items()
    ]
    pack = flag_of("pack", pack)
    if not pack and (pack_nodes is not None or pack_walltime is not None):
        raise InvalidValue(
            "pack_nodes" if pack_nodes is not None else "pack_walltime",
            pack_nodes if pack_nodes is not None else pack_walltime,
            "only with pack=True",
        )
    if pack and backlog:
        raise InvalidValue(
            "backlog", backlog, "False with pack=True (a pack's points wait for its nodes)"
        )
    if pack:
        pack_nodes = None if pack_nodes is None else whole_of("pack_nodes", pack_nodes, 1)
        pack_walltime = None if pack_walltime is None else _word(pack_walltime)
        with lock:
            packed = packs.pack_points(
                shared,
                swept_nodes,
                axes,
                pack_nodes,
                pack_walltime,
                db,
                template,
                host,
                env_check,
                devices=swept_devices,
            )
            _typed(packed.points[0].plan.workload, "options", fixed_values)
            _typed(packed.points[0].plan.workload, "grid", grid)
            sweep_id, record = packs.submit_pack(packed, db)
        return Sweep(sweep_id, [], [p.values for p in packed.points], Job(record, db))
    with lock:
        swept, planned = usecases.sweep_points(
            shared, swept_nodes, axes, db, template, host, backlog=backlog
        )
        _typed(planned[0].plan.workload, "options", fixed_values)
        _typed(planned[0].plan.workload, "grid", grid)
        sweep_id, records, notes = usecases.submit_sweep(
            swept, planned, db, template, host, env_check, backlog=backlog
        )
    _warn(notes)
    return Sweep(sweep_id, [Job(r, db) for r in records], [p.values for p in planned])


class Allocation:
    """A held allocation (`allocate()`, `mmm-orch allocate`): one job that runs the runs sent
    into it while it lives, each a Job of its own. `job` is its own job, whose id names it."""

    def __init__(self, job: Job):
        self.job = job

    id = property(lambda self: self.job.id)

    def __repr__(self) -> str:
        return f"Allocation({self.id}, {self.job.machine}, {self.job.state})"

    def submit(
        self,
        workload: str | None = None,
        *,
        template: str | None = None,
        env_check: bool = True,
        **options: Any,
    ) -> Job:
        """A run sent into it, as `mmm-orch submit ... --into ID`: recorded waiting at once,
        started by the allocation when it has room (a run that cannot finish before its end is
        not started there: it waits for the allocation made after it)."""
        chosen = _request(self.job.machine, workload, options)
        template = path_of("template", template, none=True)
        env_check = flag_of("env_check", env_check)
        with lock:
            prepared, held = allocations.prepare_run(
                chosen, self.id, self.job.db, template, env_check
            )
            _typed(prepared.plan.workload, "options", {k: [v] for k, v in chosen.options})
            return Job(allocations.send(prepared, held, self.job.db), self.job.db)

    def runs(self) -> list[Job]:
        """The runs sent into it and given back by it, refreshed, first sent first."""
        with lock:
            db = opened(self.job.db)
            records = allocations.runs(db, allocations.held(db, self.id, "allocation"))
        return [Job(record, self.job.db) for record in records]

    def wait(self, timeout: float | None = None, poll: float = 2.0) -> Allocation:
        """Until its job has ended (its walltime, a cancel); itself."""
        self.job.wait(timeout, poll)
        return self

    def cancel(self) -> list[str]:
        """End it now: its running runs are stopped and given back with those not started."""
        return self.job.cancel()


def allocate(
    machine: str,
    *,
    nodes: int | None = None,
    walltime: str | None = None,
    queue: str | None = None,
    account: str | None = None,
    name: str | None = None,
    after: int | Allocation | None = None,
    template: str | None = None,
    env_check: bool = True,
    db: str | None = None,
) -> Allocation:
    """Hold an allocation, as `mmm-orch allocate`: its job submitted now; runs go into it with
    its submit(). `after`: an earlier allocation on the machine, whose runs not started there
    (and those it gave back at its end) this one takes."""
    chosen = _request(
        machine,
        "command",
        {"nodes": nodes, "walltime": walltime, "queue": queue, "account": account, "name": name},
    )
    earlier = after.id if isinstance(after, Allocation) else whole_of("after", after, 1, none=True)
    template, db = path_of("template", template, none=True), path_of("db", db, none=True)
    env_check = flag_of("env_check", env_check)
    with lock:
        prepared = allocations.prepare(chosen, db, template, after=earlier, env_check=env_check)
        return Allocation(Job(allocations.allocate(prepared, db, earlier), db))


def allocation(job_id: int, db: str | None = None) -> Allocation:
    """An allocation held earlier, by the id `allocate` gave it (its job's)."""
    found = job(job_id, db)
    with lock:
        allocations.held(opened(found.db), found.id, "job_id")
    return Allocation(found)


def backlog(db: str | None = None) -> list[Job]:
    """The runs waiting in the backlog, first come first, once it has been moved (what the
    queues admit now is submitted, as `mmm-orch backlog` does); cancel() takes one out."""
    db = path_of("db", db, none=True)
    with lock:
        opened_db = following.open_jobs(db)
        if opened_db is None:
            return []
        backlogs.move(opened_db)
        return [Job(record, db) for record in backlogs.waiting(opened_db)]


def job(job_id: int, db: str | None = None) -> Job:
    """An earlier job, by its id (as `mmm-orch status` shows it), from this process or another."""
    job_id, db = whole_of("job_id", job_id, 1), path_of("db", db, none=True)
    with lock:
        opened_db = following.open_jobs(db)
        record = opened_db.get(job_id, events=False) if opened_db is not None else None
    if record is None:
        raise MmmError(f"job {job_id} not found")
    return Job(record, db)


def jobs(
    machine: str | None = None,
    state: str | None = None,
    sweep: int | None = None,
    limit: int | None = None,
    db: str | None = None,
) -> list[Job]:
    """Recorded jobs, newest last: of a machine, in a state (as last refreshed), of a sweep."""
    machine, state = name_of("machine", machine, none=True), text_of("state", state, none=True)
    if state is not None and state not in {s.value for s in JobState}:
        raise InvalidValue("state", state, "one of " + ", ".join(s.value for s in JobState))
    sweep, limit = whole_of("sweep", sweep, 1, none=True), whole_of("limit", limit, 1, none=True)
    db = path_of("db", db, none=True)
    with lock:
        records = following.recorded(following.open_jobs(db), machine, sweep, limit)
    return [Job(r, db) for r in records if state is None or r.state.value == state]


def report(targets: Sweep | Iterable[Job], out: str | Path | None = None) -> list[dict[str, Any]]:
    """The report's rows, one per job (step time, per-device throughput, MFU, startup, scaling
    efficiency), as `mmm-orch report` computes them; with `out`, also its directory of figures
    (where matplotlib is installed) and report.html."""
    if isinstance(targets, Sweep):
        db = targets.pack or (targets.jobs[0] if targets.jobs else None)
        with lock:
            chosen = reports.targets(
                opened(db.db if db is not None else None), [("sweep", targets.id)]
            )
    else:
        given = jobs_of("targets", targets, empty=False)
        with lock:
            chosen = reports.of_records(
                [opened(each.db).get(each.id, events=False) or each.record for each in given]
            )
    out = path_of("out", out, none=True)
    with lock:
        return reports.rows(reports.report(chosen, out))


def usage(
    machine: str | None = None,
    account: str | None = None,
    since: str | None = None,
    by: str | None = None,
    db: str | None = None,
) -> list[dict[str, Any]]:
    """What the recorded jobs were charged, as `mmm-orch usage` sums it: one dict per machine,
    account (and workload, sweep, chain or day with `by`); open jobs are refreshed first."""
    machine = name_of("machine", machine, none=True)
    account = name_of("account", account, none=True)
    since, by = text_of("since", since, none=True), text_of("by", by, none=True)
    db = path_of("db", db, none=True)
    with lock:
        rows, _ = usecases.usage(following.open_jobs(db), machine, account, since, by)
    return usecases.usage_dicts(rows)


def balance(machine: str, account: str | None = None, host: str | None = None) -> dict[str, Any]:
    """The project's allocations and what remains, from the facility's tool (`mmm-orch balance`);
    where it cannot tell, no allocations and a `note` saying why."""
    machine, account = text_of("machine", machine), name_of("account", account, none=True)
    return usecases.balance(machine, account, name_of("host", host, none=True)).to_dict()
