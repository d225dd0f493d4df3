"""The Python API given hostile values: every public function's and Job method's every parameter,
given a wrong type, NaN or infinity, a huge or negative number, a name with a line break, or an
object whose str and repr raise, raises InvalidValue with one line naming the parameter, and does
nothing (no record, no file, no job)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

import mmm_orch
from helpers.bad_input import files_under


class Hostile:
    """A value whose str and repr raise: no message may be made by asking them."""

    def __str__(self) -> str:
        raise RuntimeError("str of a hostile value")

    __repr__ = __str__


class HostileStr(str):
    __str__ = __repr__ = Hostile.__str__


class HostileInt(int):
    __str__ = __repr__ = Hostile.__str__


NAN, INF, HUGE, PAST_SQLITE = math.nan, math.inf, 10**400, 2**70

# What each kind of parameter is given (each must be refused).
NAME = [None, 5, b"local", ["local"], "a\nb", Hostile()]  # a required name
MAYBE_NAME = [5, b"x", ["x"], "a\nb", "", Hostile()]  # a name or None
PLAN_TEXT = [5, b"x", ["x"], "a\nb", Hostile()]  # planning checks the words
PATH = [5, b"jobs.db", "", "a\nb", Hostile()]
COUNT = ["2", 1.5, NAN, INF, -1, 0, HUGE, PAST_SQLITE, True, Hostile()]  # 1 or more
COUNT_FROM_0 = [v for v in COUNT if v != 0]
MAYBE_ID = COUNT + ["s1"]  # an id (or a limit) or None
SECONDS = ["x", NAN, INF, -1, HUGE, True, Hostile()]
FLAG = ["yes", 1, None, Hostile()]
WORDS = ["nccl", [5], ["a\nb"], [Hostile()], Hostile(), 5]
JOBS = [[None], None, 5, "s1", [Hostile()], Hostile()]

LOCAL = dict(command=[sys.executable, "-c", "print('hi')"])

# (name, call(job, value), the values, the words that name the parameter in the message)
ENTRIES = [
    ("plan machine", lambda j, v: mmm_orch.plan(v, "fsdp"), NAME, "machine"),
    ("plan db", lambda j, v: mmm_orch.plan("local", "fsdp", db=v), PATH, "db"),
    ("plan keyword", lambda j, v: mmm_orch.plan("local", "fsdp", nodez=v), [2], "nodez"),
    (
        "render template",
        lambda j, v: mmm_orch.render("local", "fsdp", template=v),
        PATH,
        "template",
    ),
    (
        "submit chain",
        lambda j, v: mmm_orch.submit("local", **LOCAL, chain=v),
        COUNT_FROM_0 + [None, 201],
        "chain",
    ),
    ("submit host", lambda j, v: mmm_orch.submit("local", **LOCAL, host=v), MAYBE_NAME, "host"),
    (
        "submit template",
        lambda j, v: mmm_orch.submit("local", **LOCAL, template=v),
        PATH,
        "template",
    ),
    (
        "submit env_check",
        lambda j, v: mmm_orch.submit("local", **LOCAL, env_check=v),
        FLAG,
        "env_check",
    ),
    ("submit db", lambda j, v: mmm_orch.submit("local", **LOCAL, db=v), PATH, "db"),
    (
        "submit options",
        lambda j, v: mmm_orch.submit("local", "fsdp", options=v),
        [["steps=1"], {5: 1}, {"steps=1": 1}, {Hostile(): 1}, Hostile()],
        "options",
    ),
    (
        "submit int option",
        lambda j, v: mmm_orch.submit("local", "fsdp", options={"epochs": v}),
        ["10", 1.5, NAN, HUGE, True, None, [1], Hostile()],
        "epochs",
    ),
    (
        "submit bool option",
        lambda j, v: mmm_orch.submit("local", "fsdp", options={"tiny": v}),
        ["yes", "true", 1, Hostile()],
        "tiny",
    ),
    (
        "submit float option",
        lambda j, v: mmm_orch.submit("local", "fsdp", options={"lr": v}),
        ["1e-3", NAN, INF, -INF, HUGE, True],
        "lr",
    ),
    (
        "submit env",
        lambda j, v: mmm_orch.submit("local", **LOCAL, env=v),
        [["A=1"], {5: "1"}, {"A=B": "c"}, {"A": 5}, {"A": Hostile()}, {"A": "a\nb"}, Hostile()],
        "env",
    ),
    (
        "submit command",
        lambda j, v: mmm_orch.submit("local", command=v),
        ["python3 x.py", [5], [Hostile()], Hostile(), 5, ["python3", "a\nb"]],
        "command",
    ),
    ("submit presets", lambda j, v: mmm_orch.submit("local", **LOCAL, presets=v), WORDS, "preset"),
    (
        "submit no_presets",
        lambda j, v: mmm_orch.submit("local", **LOCAL, no_presets=v),
        WORDS,
        "preset",
    ),
    ("submit nodes", lambda j, v: mmm_orch.submit("local", **LOCAL, nodes=v), COUNT, "nodes"),
    (
        "submit spare_nodes",
        lambda j, v: mmm_orch.submit("local", **LOCAL, spare_nodes=v),
        COUNT_FROM_0,
        "spare_nodes",
    ),
    (
        "submit stage_env",
        lambda j, v: mmm_orch.submit("local", **LOCAL, stage_env=v),
        FLAG,
        "stage_env",
    ),
    (
        "submit max_node_hours",
        lambda j, v: mmm_orch.submit("local", **LOCAL, max_node_hours=v),
        ["1", NAN, INF, 0, -1, HUGE, True, Hostile()],
        "max_node_hours",
    ),
    *[
        (
            f"submit {field}",
            lambda j, v, field=field: mmm_orch.submit("local", **LOCAL, **{field: v}),
            PLAN_TEXT,
            field,
        )
        for field in ("queue", "walltime", "account", "name", "workdir")
    ],
    ("submit workload", lambda j, v: mmm_orch.submit("local", v), PLAN_TEXT, "workload"),
    (
        "submit a plan and more",
        lambda j, v: mmm_orch.submit(mmm_orch.plan("local", **LOCAL), nodes=v),
        [Hostile()],
        "nodes",
    ),
    (
        "sweep nodes",
        lambda j, v: mmm_orch.sweep("local", "fsdp", nodes=v),
        [
            "1,2",
            ["1,2"],
            ["1"],
            [],
            [0],
            [-1],
            [1.5],
            [NAN],
            [HUGE],
            [PAST_SQLITE],
            [True],
            [Hostile()],
            Hostile(),
            5,
        ],
        "nodes",
    ),
    (
        "sweep grid",
        lambda j, v: mmm_orch.sweep("local", "fsdp", grid=v),
        [["lr"], {5: [1]}, {"lr=1": [1]}, Hostile()],
        "grid",
    ),
    (
        "sweep grid values",
        lambda j, v: mmm_orch.sweep("local", "fsdp", grid={"epochs": v}),
        ["10", [], ["10"], [1.5], [HUGE], [True], [None], [Hostile()], Hostile()],
        "epochs",
    ),
    (
        "sweep float grid",
        lambda j, v: mmm_orch.sweep("local", "fsdp", grid={"lr": v}),
        [[NAN]],
        "lr",
    ),
    (
        "sweep bool grid",
        lambda j, v: mmm_orch.sweep("local", "fsdp", grid={"tiny": v}),
        [["yes"], [1]],
        "tiny",
    ),
    (
        "sweep option",
        lambda j, v: mmm_orch.sweep("local", "fsdp", options={"tiny": v}),
        ["yes", Hostile()],
        "tiny",
    ),
    ("sweep host", lambda j, v: mmm_orch.sweep("local", "fsdp", host=v), MAYBE_NAME, "host"),
    ("sweep template", lambda j, v: mmm_orch.sweep("local", "fsdp", template=v), PATH, "template"),
    (
        "sweep env_check",
        lambda j, v: mmm_orch.sweep("local", "fsdp", env_check=v),
        FLAG,
        "env_check",
    ),
    ("sweep db", lambda j, v: mmm_orch.sweep("local", "fsdp", db=v), PATH, "db"),
    (
        "sweep max_node_hours",
        lambda j, v: mmm_orch.sweep("local", "fsdp", max_node_hours=v),
        [NAN, HUGE, Hostile()],
        "max_node_hours",
    ),
    ("job id", lambda j, v: mmm_orch.job(v, db=j.db), MAYBE_ID + [None], "job_id"),
    ("job db", lambda j, v: mmm_orch.job(1, db=v), PATH, "db"),
    ("jobs machine", lambda j, v: mmm_orch.jobs(machine=v, db=j.db), MAYBE_NAME, "machine"),
    ("jobs state", lambda j, v: mmm_orch.jobs(state=v, db=j.db), MAYBE_NAME, "state"),
    ("jobs sweep", lambda j, v: mmm_orch.jobs(sweep=v, db=j.db), MAYBE_ID, "sweep"),
    ("jobs limit", lambda j, v: mmm_orch.jobs(limit=v, db=j.db), MAYBE_ID, "limit"),
    ("jobs db", lambda j, v: mmm_orch.jobs(db=v), PATH, "db"),
    ("refresh", lambda j, v: mmm_orch.refresh(v), JOBS, "jobs"),
    ("report", lambda j, v: mmm_orch.report(v), JOBS + [[]], "targets"),
    ("report out", lambda j, v: mmm_orch.report([j], out=v), PATH, "out"),
    ("usage machine", lambda j, v: mmm_orch.usage(machine=v, db=j.db), MAYBE_NAME, "machine"),
    ("usage account", lambda j, v: mmm_orch.usage(account=v, db=j.db), MAYBE_NAME, "account"),
    ("usage since", lambda j, v: mmm_orch.usage(since=v, db=j.db), PLAN_TEXT + [""], "since"),
    ("usage by", lambda j, v: mmm_orch.usage(by=v, db=j.db), PLAN_TEXT + [""], "by"),
    ("usage db", lambda j, v: mmm_orch.usage(db=v), PATH, "db"),
    ("balance machine", lambda j, v: mmm_orch.balance(v), NAME, "machine"),
    ("balance account", lambda j, v: mmm_orch.balance("local", v), MAYBE_NAME, "account"),
    ("balance host", lambda j, v: mmm_orch.balance("local", host=v), MAYBE_NAME, "host"),
    ("Job record", lambda j, v: mmm_orch.Job(v), [None, 5, {"id": 1}, Hostile()], "record"),
    ("Job db", lambda j, v: mmm_orch.Job(j.record, v), PATH, "db"),
    ("Job.wait timeout", lambda j, v: j.wait(timeout=v), SECONDS, "timeout"),
    ("Job.wait poll", lambda j, v: j.wait(poll=v), SECONDS + [0], "poll"),
    ("Job.wait max_poll", lambda j, v: j.wait(max_poll=v), SECONDS + [0], "max_poll"),
    ("Job.logs tail", lambda j, v: j.logs(tail=v), COUNT_FROM_0, "tail"),
    (
        "Job.rerun resume",
        lambda j, v: j.rerun(resume=v),
        [f for f in FLAG if f is not None],
        "resume",
    ),
]


def _id(value: object) -> str:
    try:
        return repr(value)[:30]
    except RuntimeError:
        return "hostile"


def _case(name: str, call, value: object, words: str):
    return pytest.param(call, value, words, id=f"{name}={_id(value)}")


CASES = [
    _case(name, call, value, words) for name, call, values, words in ENTRIES for value in values
]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A finished local job in a database of its own (the calls on it must leave it as it is)."""
    root = tmp_path_factory.mktemp("recorded")
    with pytest.MonkeyPatch.context() as patch:
        for var in ("HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
            patch.setenv(var, str(root / var.lower()))
        patch.chdir(root)
        job = mmm_orch.submit("local", **LOCAL, db=root / "jobs.db")
        assert job.wait(timeout=120, poll=0.2).state == "completed", job.logs()
    return job


def _state(root: Path, job: mmm_orch.Job) -> tuple:
    """What a call could have changed: files here, the recorded job's files and every record."""
    job_dir = Path(job.db).parent
    return (
        files_under(root, root / "cache"),
        files_under(job_dir, job_dir / "cache"),
        [each.to_dict() for each in mmm_orch.jobs(db=job.db)],
        mmm_orch.jobs(),
    )


@pytest.mark.parametrize("call,value,words", CASES)
def test_a_hostile_value_is_refused_in_one_line_naming_its_parameter(
    tmp_path, recorded, call, value, words
):
    before = _state(tmp_path, recorded)
    with pytest.raises(mmm_orch.InvalidValue) as raised:
        call(recorded, value)
    message = str(raised.value)
    assert "\n" not in message and words in message, message
    # raised where the value was checked, not while handling an error from deep inside
    assert raised.value.__context__ is None or raised.value.__suppress_context__, message
    assert _state(tmp_path, recorded) == before


def test_the_three_silently_accepted_are_refused(tmp_path, recorded):
    before = _state(tmp_path, recorded)
    with pytest.raises(mmm_orch.InvalidValue, match=r"^nodes '1,2' is invalid"):
        mmm_orch.sweep("local", "fsdp", nodes=["1,2"])
    with pytest.raises(mmm_orch.InvalidValue, match=r"^options tiny 'yes' is invalid: True or"):
        mmm_orch.submit("local", "fsdp", options={"tiny": "yes"})
    with pytest.raises(mmm_orch.InvalidValue, match=r"^tail -1 is invalid"):
        recorded.logs(tail=-1)
    assert _state(tmp_path, recorded) == before
    # while the values of the right type are taken
    assert mmm_orch.plan("local", "fsdp", options={"tiny": True}).launch.args["tiny"] is True
    last = recorded.logs(tail=1)
    assert last.count("\n") == 1 and recorded.logs().endswith(last)


def test_a_str_or_int_whose_str_raises_is_used_as_its_plain_value(tmp_path):
    made = mmm_orch.plan(
        HostileStr("local"),
        HostileStr("fsdp"),
        nodes=HostileInt(1),
        options={HostileStr("epochs"): HostileInt(3)},
    )
    assert (made.machine, made.workload, made.layout.nodes) == ("local", "fsdp", 1)
    assert made.launch.args["epochs"] == 3
