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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmm_orch import usecases
from mmm_orch.api.job import (
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
from mmm_orch.usecases import MAX_INT, MAX_LINKS, JobState, Plan, Request, following, packs, reports

__all__ = [
    "Job",
    "Sweep",
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
    init_from: str | None = None  # pretrained weights to start from (--init-from)
    profile: str | None = None  # torch, or the machine's profiler (--profile)
    stack: str | None = None  # the machine's software stack (--stack); None: its default

    def __post_init__(self) -> None:
        """Python's types where the command line's parser would check them, each value made
        plain: a wrong type is an InvalidValue, never a TypeError from deep inside. What a name
        or a walltime may say, planning checks, in the command line's words."""
        plain = {
            "machine": text_of("machine", self.machine),
            **{
                field: text_of(field, getattr(self, field), none=True)
                for field in (
                    "workload",
                    "queue",
                    "walltime",
                    "account",
                    "name",
                    "workdir",
                    "init_from",
                    "profile",
                    "stack",
                )
            },
            "nodes": whole_of("nodes", self.nodes, 1, none=True),
            "spare_nodes": whole_of("spare_nodes", self.spare_nodes, 0),
            "stage_env": flag_of("stage_env", self.stage_env),
            "max_node_hours": number_of("max_node_hours", self.max_node_hours, none=True),
            "options": None if self.options is None else _settings("options", self.options),
            "env": None
            if self.env is None
            else {
                key: text_of(f"env {key}", value)
                for key, value in _keyed("env", self.env, "{'NCCL_DEBUG': 'INFO'}").items()
            },
            "command": None
            if self.command is None
            else _words("command", self.command, "['python3', '-m', 'mypkg.train']"),
            "presets": _words("presets", self.presets, "['nccl-ofi']"),
            "no_presets": _words("no_presets", self.no_presets, "['nccl-ofi']"),
        }
        for field, value in plain.items():
            object.__setattr__(self, field, value)

    def request(self, swept: bool = False) -> Request:
        if self.workload is None and not self.command:
            raise InvalidValue(
                "workload",
                None,
                "a workload's name, or command=[...]",
                "workload is missing: name one (`mmm-orch workloads`), or give "
                "your own command: command=['python3', '-m', 'mypkg.train'], as "
                "after -- on the command line",
            )
        return Request(
            machine=self.machine,
            workload=self.workload or "command",
            command=tuple(self.command or ()),
            nodes=None if swept else self.nodes,
            queue=self.queue,
            walltime=self.walltime,
            account=self.account,
            name=self.name,
            sets=() if swept else tuple(f"{k}={_word(v)}" for k, v in (self.options or {}).items()),
            envs=tuple(f"{k}={v}" for k, v in (self.env or {}).items()),
            presets=tuple(self.presets),
            no_presets=tuple(self.no_presets),
            spare_nodes=self.spare_nodes,
            stage_env=self.stage_env,
            workdir=self.workdir,
            max_node_hours=self.max_node_hours,
            init_from=self.init_from,
            profile=self.profile,
            stack=self.stack,
        )


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


_PYTHON_TYPES = {
    "bool": ((bool,), "True or False"),
    "int": ((int,), "an int"),
    "float": ((int, float), "an int or float"),
    "str": ((str,), "a str"),
    "choice": ((str,), "a str"),
}


def _typed(workload: str, field: str, given: Mapping[str, Sequence[Any]]) -> None:
    """Each option given a value of its Python type: planning reads values as the command line's
    text, where 'yes' is a bool and '10' an int; from Python those are mistakes."""
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


def _plan_options(machine: Any, workload: Any, options: dict[str, Any]) -> PlanOptions:
    """PlanOptions from a call's keywords: an unknown one is an UnknownName, as a misspelt
    option is on the command line."""

    known = [
        field.name
        for field in dataclasses.fields(PlanOptions)
        if field.name not in ("machine", "workload")
    ]
    for key in options:
        if key not in known:
            raise usecases.unknown_name("keyword", key, known)
    return PlanOptions(machine, workload, **options)


def _planned(options: PlanOptions, db: str | None) -> Plan:

    made = usecases.plan(options.request(), db)
    _typed(made.workload, "options", {k: [v] for k, v in (options.options or {}).items()})
    return made


def plan(
    machine: str, workload: str | None = None, *, db: str | None = None, **options: Any
) -> Plan:
    """The validated, immutable plan (what `mmm-orch render` shows); nothing is written.
    Keyword options: those of PlanOptions."""
    chosen, db = _plan_options(machine, workload, options), path_of("db", db, none=True)
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
    chosen, db = _plan_options(machine, workload, options), path_of("db", db, none=True)
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
    **options: Any,
) -> Job | list[Job]:
    """Submit as `mmm-orch submit` does and return the Job; with `chain=N`, the N links' Jobs.
    `machine` may be a plan made by `plan()`: what was reviewed is what is submitted, and a loop
    that submits one plan many times plans once. `host`: a login host to submit through over
    SSH. The job is recorded before the scheduler is asked: a process killed meanwhile leaves a
    record the next refresh settles."""

    chain = whole_of("chain", chain, 0, MAX_LINKS)  # 0: one job, no chain
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
        chosen = _plan_options(machine, workload, options)
    with lock:
        if isinstance(machine, Plan):
            checked = machine
        else:
            assert chosen is not None  # made above for a machine's name
            checked = _planned(chosen, db)
        prepared = usecases.prepare_plan(checked, template, host, env_check, chain, db)
        if chain:
            links = [Job(record, db) for record in usecases.submit_chain(prepared, chain, db)]
        else:
            made = Job(usecases.submit(prepared, db), db)
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
    **options: Any,
) -> Sweep:
    """Submit every point of `nodes` x `grid` (option -> values) as one sweep, all or none, as
    `mmm-orch sweep --nodes 1,2 --set lr=1e-3,3e-4` does; fixed `options` apply to every
    point. `pack`: one job runs them all side by side (`sweep --pack`, `--pack-nodes`,
    `--pack-walltime`); `devices`: with `pack`, points on that many devices of one node each,
    besides those of `nodes` (`--devices`)."""

    fixed = _plan_options(machine, workload, options)
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
    fixed_values = {key: [value] for key, value in (fixed.options or {}).items()}
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
    if pack:
        pack_nodes = None if pack_nodes is None else whole_of("pack_nodes", pack_nodes, 1)
        pack_walltime = None if pack_walltime is None else _word(pack_walltime)
        with lock:
            packed = packs.pack_points(
                fixed.request(swept=True),
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
            fixed.request(swept=True), swept_nodes, axes, db, template, host
        )
        _typed(planned[0].plan.workload, "options", fixed_values)
        _typed(planned[0].plan.workload, "grid", grid)
        sweep_id, records, notes = usecases.submit_sweep(
            swept, planned, db, template, host, env_check
        )
    _warn(notes)
    return Sweep(sweep_id, [Job(r, db) for r in records], [p.values for p in planned])


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
