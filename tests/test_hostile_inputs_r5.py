"""Reliability round 5 (issue 50), in-process: a damaged torch.profiler trace, the reference
generator's pages and directory, a profile's routing tiers and job-limit sources, profile_ranks
named twice, a global batch no plan can use, `env create` on a read-only file system and a
caller's `__index__` that raises. Each is refused in one line (exit 2, or InvalidValue from the
API), with nothing written, nothing of the user's overwritten and nothing waited on for ever."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from helpers.jobs import assert_nothing_recorded
from helpers.profiles import write_machine

import mmm_orch
from mmm_orch.reference import PAGES


def assert_one_line(result, *fragments: str) -> str:
    assert result.code == 2, (result.code, result.err[-2000:])
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mmm-orch: error: "), result.err[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


# -- mmm-orch profile on a damaged trace ------------------------------------------------------


def span(name, ts, dur, tid=1, cat="user_annotation") -> dict:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "cat": cat}


STEP = span("mmm:step#4", 0, 100)
NO_TS = {k: v for k, v in STEP.items() if k != "ts"}


def _trace_text(events: list) -> str:
    return json.dumps({"traceEvents": events})


# What a trace file holds (text), or how it is made in its place (a callable of its path)
DAMAGED = {
    "a step range without ts": (_trace_text([NO_TS]), "ts None is not a number"),
    "dur null": (_trace_text([span("mmm:step#4", 0, None)]), "dur None is not a number"),
    "dur a list": (_trace_text([span("mmm:step#4", 0, [1])]), "dur [1] is not a number"),
    "an operator's dur text": (
        _trace_text([STEP, span("aten::mm", 1, "abc", cat="cpu_op")]),
        "event 'aten::mm': dur 'abc'",
    ),
    "ts NaN": (
        '{"traceEvents": [{"ph": "X", "name": "mmm:step#4", "ts": NaN, "dur": 1, "tid": 1}]}',
        "ts nan is not a number",
    ),
    "dur past any clock": (_trace_text([span("mmm:step#4", 0, 1e308)]), "at most 9007199254740992"),
    "a negative dur": (_trace_text([span("mmm:step#4", 0, -5)]), "dur -5 is negative"),
    "ts of 400 digits": (
        _trace_text([span("mmm:step#4", int("9" * 400), 5)]),
        "an integer of 400 digits",
    ),
    "deep nesting": (
        '{"traceEvents": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "nested too deeply",
    ),
    "a directory": (Path.mkdir, "is a directory, not a regular file"),
    "a symlink loop": (lambda path: path.symlink_to(path), "Too many levels of symbolic links"),
    "/dev/zero": (lambda path: path.symlink_to("/dev/zero"), "is a character device"),
    "a FIFO": (os.mkfifo, "is a FIFO (named pipe), not a regular file"),
}


@pytest.mark.timeout(60)  # a FIFO read as a file would block for ever
@pytest.mark.parametrize("case", DAMAGED)
def test_a_damaged_trace_is_refused_in_one_line_naming_the_file(cli, isolated, case):
    made, said = DAMAGED[case]
    trace = isolated / "run" / "profile" / "n1_rank0.pt.trace.json"
    trace.parent.mkdir(parents=True)
    if isinstance(made, str):
        trace.write_text(made)
    else:
        made(trace)
    started = time.monotonic()
    line = assert_one_line(cli("profile", str(isolated / "run")), said)
    assert str(trace) in line and time.monotonic() - started < 10, line


def test_names_from_a_trace_are_printed_escaped(cli, isolated):
    """An operator's name and a host's (the file's name) reach the terminal with their control
    characters escaped: no colour, no forged line."""
    trace = isolated / "run" / "profile" / "n\x1b[31m1_rank0.pt.trace.json"
    trace.parent.mkdir(parents=True)
    forged = "aten::\x1b[2J\nFORGED: the profile matches"
    trace.write_text(_trace_text([STEP, span(forged, 0, 30, cat="cpu_op")]))
    shown = cli("profile", str(isolated / "run"))
    assert shown.code == 0, shown.err
    assert "\x1b" not in shown.out and "\nFORGED" not in shown.out, shown.out
    assert "rank 0 (n\\x1b[31m1)" in shown.out
    assert "aten::\\x1b[2J\\nFORGED: the profile matches" in shown.out


# -- python -m mmm_orch.reference ---------------------------------------------------------------


@pytest.fixture
def reference(monkeypatch, capsys):
    """Run the generator in this process: (exit code, stderr). It clears MMM_ORCH_* from the
    environment and changes directory, which monkeypatch undoes after the test."""
    from mmm_orch.reference.__main__ import main

    for name in [n for n in os.environ if n.startswith("MMM_ORCH_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(os.getcwd())

    def run(*args: str) -> tuple[int, str]:
        code = main(list(args))
        return code, capsys.readouterr().err

    return run


def _refused(found: tuple[int, str], *fragments: str) -> None:
    code, err = found
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, (code, err)
    assert lines[0].startswith("python -m mmm_orch.reference: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def test_a_page_that_is_a_symlink_is_refused_and_its_target_kept(reference, tmp_path):
    mine = tmp_path / "mine.txt"
    mine.write_text("a user's own file\n")
    pages = tmp_path / "pages"
    pages.mkdir()
    (pages / "cli.md").symlink_to(mine)
    _refused(reference(str(pages)), f"{pages / 'cli.md'} is a symbolic link")
    assert mine.read_text() == "a user's own file\n"
    assert sorted(p.name for p in pages.iterdir()) == ["cli.md"]  # no page written beside it


@pytest.mark.timeout(60)
@pytest.mark.parametrize("check", [True, False], ids=["--check", "write"])
def test_a_fifo_page_is_refused_not_waited_on(reference, tmp_path, check):
    pages = tmp_path / "pages"
    pages.mkdir()
    os.mkfifo(pages / "python.md")
    found = reference(str(pages), *(["--check"] if check else []))
    _refused(found, f"{pages / 'python.md'}", "FIFO" if check else "not a regular file")
    assert sorted(p.name for p in pages.iterdir()) == ["python.md"]


@pytest.mark.parametrize("where", ["under a file", "read-only", "full"])
def test_a_directory_the_pages_cannot_be_written_in_is_one_line(reference, tmp_path, tmpfs, where):
    if where == "under a file":
        (tmp_path / "file").write_text("x")
        out, said = tmp_path / "file" / "reference", "Not a directory"
    elif where == "read-only":
        out, said = tmpfs("ro", "ro,size=1m"), "Read-only file system"
    else:
        out, said = tmpfs("full", "size=48k"), "No space left on device"  # the pages are ~80 KB
    _refused(reference(str(out)), said)
    assert not out.exists() or list(out.iterdir()) == []  # no page, whole or partial


def test_the_pages_are_written_whole_and_checked(reference, tmp_path):
    pages = tmp_path / "pages"
    assert reference(str(pages)) == (0, "")
    assert sorted(p.name for p in pages.iterdir()) == sorted(PAGES)
    assert reference(str(pages), "--check") == (0, "")


# -- a profile's queues ------------------------------------------------------------------------

QUEUE = """extends: local
name: {name}
queues:
  - name: q
    max_nodes: {queue_max}
    max_walltime: "01:00:00"
    tiers:
      - {{min_nodes: {tier_min}, max_nodes: {tier_max}, max_walltime: "01:00:00"}}
    job_limits:
      - {{jobs: 5, per: user, counts: any, source: {source}}}
"""
GOOD = {"queue_max": "8", "tier_min": "1", "tier_max": "2", "source": "a page"}
HUGE = "9" * 400


@pytest.mark.parametrize(
    "change,said",
    [
        (
            {"tier_min": "3", "tier_max": "1"},
            "queues[0].tiers[0]: Value error, min_nodes 3 is above max_nodes 1",
        ),
        ({"tier_max": HUGE}, "queues[0].tiers[0].max_nodes: Input should be less than or equal to"),
        ({"queue_max": HUGE}, "queues[0].max_nodes: Input should be less than or equal to 1000000"),
        ({"source": '"   "'}, "queues[0].job_limits[0].source: Value error, expected where the"),
    ],
    ids=[
        "tier min above max",
        "tier max of 400 digits",
        "queue max of 400 digits",
        "source of spaces",
    ],
)
def test_a_queue_that_cannot_be_used_is_refused_when_the_profile_loads(cli, isolated, change, said):
    write_machine(isolated, "tiered", QUEUE.format(name="tiered", **{**GOOD, **change}))
    line = assert_one_line(cli("show", "machine", "tiered"), "tiered.yaml", said)
    assert len(line) < 400, line  # a huge number is named by its size
    write_machine(isolated, "tiered", QUEUE.format(name="tiered", **GOOD))
    assert cli("show", "machine", "tiered").code == 0


# -- options --------------------------------------------------------------------------------------


@pytest.mark.parametrize("ranks", ["0,0", "1,0,1", "\u0661"])
def test_profile_ranks_named_twice_or_in_other_digits_are_refused(cli, isolated, ranks):
    found = cli(
        "submit",
        "local",
        "llama3_debug",
        "--set",
        "profile=torch",
        "--set",
        f"profile_ranks={ranks}",
    )
    assert_one_line(found, "--profile-ranks", "each once")
    assert_nothing_recorded()


def test_a_global_batch_no_plan_can_use_is_refused_at_once(cli, isolated):
    started = time.monotonic()
    found = cli("submit", "local", "llama3_debug", "--set", f"global_batch={10**12}")
    assert time.monotonic() - started < 1
    assert_one_line(found, "global_batch 1000000000000 is invalid: 0 to 1048576 samples a step")
    assert_nothing_recorded()


@pytest.mark.slow  # imports torch (the trainer's module)
def test_the_trainer_refuses_a_global_batch_past_the_limit(capsys):
    from mmm_orch.runtime.options import parse
    from mmm_orch.trainers.llama3 import Config

    with pytest.raises(SystemExit) as stopped:
        parse(Config, ["--global-batch", str(10**12)])
    assert stopped.value.code == 2
    assert "'1000000000000': expected an integer >= 0 and <= 1048576" in capsys.readouterr().err
    assert parse(Config, ["--global-batch", str(1 << 20)]).global_batch == 1 << 20


# -- env create ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options,said",
    [("ro,size=1m", "Read-only file system"), ("size=64k", "ensurepip")],
    ids=["read-only", "full (the environment half made)"],
)
def test_env_create_that_fails_leaves_nothing(cli, isolated, tmpfs, options, said):
    place = tmpfs("envs", options)
    home = Path(os.environ["HOME"])
    before = sorted(home.rglob("*")) if home.exists() else []
    found = cli("env", "create", "local", "--path", str(place / "project" / "job"))
    assert_one_line(found, "env create local failed", said)
    assert list(place.iterdir()) == []
    assert (sorted(home.rglob("*")) if home.exists() else []) == before  # no wheel, no dirs
    assert not (Path(os.environ["XDG_CONFIG_HOME"]) / "mmm-orch" / "environments.json").exists()


# -- the Python API -------------------------------------------------------------------------------


class RaisingIndex:
    """A caller's integer-like object whose __index__ raises (a lazy value not ready, say)."""

    def __index__(self) -> int:
        raise ValueError("not ready")


class RaisingFloat(float):
    def __float__(self) -> float:
        raise RuntimeError("not ready")


class RaisingCompare(int):
    def __le__(self, other):
        raise RuntimeError("not comparable")

    __ge__ = __lt__ = __gt__ = __le__


@pytest.mark.parametrize(
    "call,words",
    [
        (lambda: mmm_orch.plan("local", "fsdp", nodes=RaisingIndex()), "nodes <"),
        (lambda: mmm_orch.job(RaisingIndex()), "job_id <"),
        (lambda: mmm_orch.jobs(limit=RaisingIndex()), "limit <"),
        (
            lambda: mmm_orch.plan("local", "fsdp", options={"epochs": RaisingIndex()}),
            "options epochs <",
        ),
    ],
    ids=["nodes", "job", "jobs limit", "an option"],
)
def test_a_callers_index_that_raises_is_an_invalid_value(call, words):
    with pytest.raises(mmm_orch.InvalidValue) as raised:
        call()
    message = str(raised.value)
    assert "\n" not in message and message.startswith(words), message
    assert "RaisingIndex object" in message


def test_a_callers_int_or_float_subclass_is_taken_as_its_plain_value():
    made = mmm_orch.plan(
        "local",
        "fsdp",
        nodes=RaisingCompare(1),
        options={"epochs": RaisingCompare(3), "lr": RaisingFloat(0.5)},
    )
    assert made.layout.nodes == 1
    assert made.launch.args["epochs"] == 3 and made.launch.args["lr"] == 0.5
