"""Hostile or broken input around sweeps, chains, reports and plots, generated over each class:
grids and value lists past their bounds, one value spelled two ways for every option type of
every workload, --chain values, --out paths of the wrong kind, every kind of damaged metrics row,
and sweep points and plans edited in the job database, a disk too full for a report. A refusal
is exit 2 with one line `mmm-orch: error: ...`, no traceback, nothing written and, for the big
ones, within seconds; a FIFO in a path's place hangs nothing. Reports and plots read one real
sweep on the local executor, made once for the module (each test restores what it damaged), in
this process."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import sqlite3
import time
from pathlib import Path

import pytest

from helpers.cli import run_cli
from helpers.jobs import TERMINAL
from mmm_orch.cli import main

pytestmark = pytest.mark.xdist_group("hostile-sweeps")
# CPU seconds of this process (the CLI runs in it): a refusal of a huge input is as quick as one
# of a small one. CPU time, not wall time, so that a busy machine does not read as a slow refusal.
FAST = 5.0
# A FIFO opened for reading blocks forever: a test that puts one where a report or plot reads or
# writes fails at this bound (its own call, not the module's sweep) rather than hang the suite.
HANG = 120


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if "cache" not in p.parts}


def cli_in(env: dict[str, str], cwd: Path, *args: str) -> str:
    """What `mmm-orch ARGS` prints, run in this process with `env` set and in `cwd` (a fresh
    interpreter costs about 0.3 CPU-seconds, a poll every 2 s adds up)."""
    import io

    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    out = io.StringIO()
    try:
        os.environ.update(env)
        os.chdir(cwd)
        with contextlib.redirect_stdout(out):
            assert main(list(args)) == 0
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
    return out.getvalue()


def finished_local_sweep(root: Path) -> tuple[dict[str, str], dict[int, dict]]:
    """A real two-job sweep of the fsdp trainer on the local executor, with its own state, cache
    and config under `root`, run to its end: its environment and its status rows by job id."""
    env = {"XDG_STATE_HOME": str(root / "state"), "HOME": str(root / "home"),
           "XDG_CACHE_HOME": str(root / "cache"), "XDG_CONFIG_HOME": str(root / "config")}
    # tiny: 256 test images to score rather than 10,000
    proc = run_cli("sweep", "local", "fsdp", "--set", "train_samples=256,512", "--set",
                   "epochs=1", "--set", "tiny=true", env=env, cwd=root)
    assert proc.returncode == 0, proc.stderr
    deadline = time.monotonic() + 600
    while True:
        rows = json.loads(cli_in(env, root, "status", "--all", "--json"))
        if len(rows) == 2 and all(r["state"] in TERMINAL for r in rows):
            break
        assert time.monotonic() < deadline, rows
        time.sleep(2)
    assert all(r["state"] == "completed" for r in rows), rows
    return env, {r["id"]: r for r in rows}


def refused(result, *fragments: str) -> str:
    assert result.code == 2, (result.code, result.out[-500:], result.err[-2000:])
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mmm-orch: error: "), result.err[-2000:]
    assert "Traceback" not in result.err and "internal error" not in result.err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0][:1000])
    return lines[0]


def refused_quietly(cli, root: Path, *argv: str, fragments=(), bound: float = FAST) -> str:
    """Refused with one line, in `bound` seconds, with no file written under `root`."""
    before = _tree(root)
    started = time.process_time()
    result = cli(*argv)
    elapsed = time.process_time() - started
    line = refused(result, *fragments)
    assert result.out == ""
    assert elapsed < bound, f"{elapsed:.1f}s"
    assert _tree(root) == before
    return line


# -- grids ------------------------------------------------------------------------------------

def _values(n: int, start: int = 0) -> str:
    return ",".join(map(str, range(start, start + n)))


GRIDS = {
    "ten options of ten values": (["--nodes", "1,2"] + [a for i in range(10) for a in
                                  ("--set", f"k{i}=" + _values(10))], ["20000000000 points",
                                                                       "more than 1000"]),
    "two axes just over": (["--set", "seed=" + _values(50), "--set", "epochs=" + _values(21, 1)],
                           ["50 seed x 21 epochs is 1050 points, more than 1000"]),
    "one axis just over": (["--set", "seed=" + _values(1001)], ["--set seed: more than 1000"]),
    "a million values": (["--set", "seed=" + _values(10**6)], ["--set seed: more than 1000"]),
    "a million node counts": (["--nodes", _values(10**6, 1)], ["--nodes: more than 1000"]),
    "a million escaped commas": (["--set", "data_dir=" + "\\," * 10**6],
                                 ["--set data_dir", "at most 4096"]),
    "a ten-megabyte value": (["--set", "data_dir=" + "x" * 10**7], ["at most 4096"]),
    "a node count past any machine": (["--nodes", "1" * 100], ["--nodes", "1-9999999"]),
    "a node count of 5000 digits": (["--nodes", "1" * 5000], ["--nodes", "at most 4096"]),
    "a node count in other digits": (["--nodes", "\u00b2"], ["--nodes '\u00b2' is invalid"]),
    "arabic-indic digits": (["--nodes", "\u0661"], ["--nodes '\u0661' is invalid"]),
}


@pytest.mark.parametrize("kind", GRIDS)
def test_a_grid_past_its_bounds_is_refused_before_it_is_expanded(cli, tmp_path, kind):
    argv, fragments = GRIDS[kind]
    line = refused_quietly(cli, tmp_path, "sweep", "local", "fsdp", *argv, fragments=fragments)
    assert len(line) < 1000  # a refusal names the value, it does not repeat it


@pytest.mark.parametrize("points", [999, 1000])
def test_a_grid_at_the_bound_is_planned(cli, points):
    started = time.process_time()
    result = cli("sweep", "local", "fsdp", "--set", "seed=" + _values(points), "--dry-run")
    assert result.code == 0, result.err[-2000:]
    assert f"{points} points (nothing submitted)" in result.out
    assert time.process_time() - started < 3 * FAST


# -- one value spelled two ways -----------------------------------------------------------------

def _spellings(option) -> list[tuple[str, str]]:
    """Pairs of spellings of one value, as the trainer would get it."""
    if option.type == "bool":
        return [("true", "True"), ("1", "yes"), ("off", "FALSE")]
    if option.type == "choice":
        return [(option.choices[0], option.choices[0])]
    if option.type == "int":
        low = int(option.ge if option.ge is not None else (option.gt or 0) + 1)
        high = str(low + 100)
        return [(str(low), f"0{low}"), (str(low), f"+{low}"), (high, f"{high[0]}_{high[1:]}")]
    if option.type == "float":
        return [("0.5", "5e-1"), ("0.5", ".50"), ("0.25", "2.5E-1")]
    word = next(w for w in ("a", "4", "run1") if re.fullmatch(option.pattern or ".*", w))
    return [(word, word)]


def _spelling_cases():
    from mmm_orch.config import registry

    cases = [("fsdp", "nodes", "1", "01"), ("fsdp", "nodes", "2", "002")]
    for workload in registry.names("workloads"):
        for name, option in registry.load_workload(workload).options.items():
            cases += [(workload, name, *pair) for pair in _spellings(option)]
    return cases


def test_every_option_type_has_a_spelling_case():
    from mmm_orch.config import registry

    types = {o.type for w in registry.names("workloads")
             for o in registry.load_workload(w).options.values()}
    assert types == {"int", "float", "str", "bool", "choice"}, types


@pytest.mark.parametrize("workload,name,first,second", _spelling_cases(),
                         ids=lambda v: str(v))
def test_one_value_spelled_two_ways_is_refused(cli, tmp_path, workload, name, first, second):
    flag = ["--nodes", f"{first},{second}"] if name == "nodes" else \
        ["--set", f"{name}={first},{second}"]
    shown = "--nodes" if name == "nodes" else f"--set {name}"
    refused_quietly(cli, tmp_path, "sweep", "local", workload, *flag,
                    fragments=[f"{shown}: {first!r} and {second!r} are the same value"])


@pytest.mark.parametrize("sets", ["lr=0.1,0.10001", "data_dir=a,A", "tiny=true,false",
                                  "seed=1,10"])
def test_values_that_differ_are_not_duplicates(cli, sets):
    result = cli("sweep", "local", "fsdp", "--set", sets, "--dry-run")
    assert result.code == 0, result.err
    assert "2 points" in result.out


# -- chains -------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["0", "-1", "201", str(10**20), "1e3", "5.0", "x", "", "1" * 5000])
def test_a_chain_outside_its_bound_is_refused_by_the_parser(cli, tmp_path, value):
    refused_quietly(cli, tmp_path, "submit", "slurm-local", "fsdp", "--chain", value,
                    fragments=["--chain", repr(value)[:50], "1-200"])


def test_the_longest_chain_is_planned(cli):
    started = time.process_time()
    result = cli("submit", "slurm-local", "fsdp", "--chain", "200", "--dry-run")
    assert result.code == 0, result.err[-2000:]
    assert "Links 2-200" in result.out
    assert time.process_time() - started < FAST


# -- the real sweep the reports read ------------------------------------------------------------

@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    _, rows = finished_local_sweep(root)
    return root / "state" / "mmm-orch" / "jobs.db", rows


@pytest.fixture
def db_cli(cli, sweep):
    """`mmm-orch --db <the sweep's database> ARGS...`, in this process."""
    return lambda *args: cli("--db", str(sweep[0]), *args)


def _sql(sweep, statement: str, *values):
    with sqlite3.connect(sweep[0]) as conn:
        return conn.execute(statement, values).fetchall()


def _jobs(sweep) -> int:
    return _sql(sweep, "SELECT count(*) FROM jobs")[0][0]


# -- --out --------------------------------------------------------------------------------------

def _plot_outs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    fifo = tmp_path / "fifo.png"
    os.mkfifo(fifo)
    (tmp_path / "file").write_text("mine\n")
    return {"a directory": (tmp_path, "is not a file"), "a FIFO": (fifo, "is not a file"),
            "no .png": (tmp_path / "curve.svg", "ending .png"),
            "no name": (tmp_path / "curve", "ending .png"),
            "a missing directory": (tmp_path / "nope" / "c.png", "no directory"),
            "under a file": (tmp_path / "file" / "c.png", "no directory")}


@pytest.mark.slow
@pytest.mark.timeout(HANG, func_only=True)
@pytest.mark.parametrize("kind", ["a directory", "a FIFO", "no .png", "no name",
                                  "a missing directory", "under a file"])
def test_plot_writes_one_png_file(db_cli, tmp_path, kind):
    out, fragment = _plot_outs(tmp_path)[kind]
    refused_quietly(db_cli, tmp_path, "plot", "1", "--out", str(out),
                    fragments=["--out", repr(str(out)), fragment])


def _report_outs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "file").write_text("mine\n")
    return {"a file": (tmp_path / "file", "cannot make the directory: a file is there"),
            "a FIFO": (fifo, "cannot make the directory: a FIFO, socket or device is there"),
            "under a file": (tmp_path / "file" / "r", "cannot make the directory"),
            "a read-only place": (Path("/proc"), "cannot write into the directory"),
            "under a read-only place": (Path("/proc/mmm-orch/r"), "cannot make the directory")}


@pytest.mark.slow
@pytest.mark.timeout(HANG, func_only=True)
@pytest.mark.parametrize("kind", ["a file", "a FIFO", "under a file", "a read-only place",
                                  "under a read-only place"])
def test_report_writes_a_directory(db_cli, tmp_path, kind):
    out, fragment = _report_outs(tmp_path)[kind]
    refused_quietly(db_cli, tmp_path, "report", "s1", "--out", str(out),
                    fragments=["--out", repr(str(out)), fragment])
    assert (tmp_path / "file").read_text() == "mine\n"


@pytest.mark.slow
def test_a_report_the_disk_cannot_hold_is_written_whole_or_not_at_all(db_cli, tmpfs):
    full = tmpfs("full", "size=24k")
    refused(db_cli("report", "s1", "--out", str(full / "r")), "--out")
    assert list(full.iterdir()) == [], list(full.rglob("*"))  # no figure, no page, no directory


# -- metrics.jsonl ------------------------------------------------------------------------------

# Each: the line, and what of it is left out: the whole LINE, or its values (the note's words).
LINE, ONE_VALUE = "line", "1 value of step records that is"
BAD_ROWS = {
    "cut short": ('{"event": "step", "step": 3, "loss": 1.', LINE),
    "not an object": ("[1, 2, 3]", LINE),
    "a bare number": ("3", LINE),
    "no event": ('{"step": 4, "loss": 1.0}', LINE),
    "a string step": ('{"event": "step", "step": "x", "loss": 1.0, "dt": 0.1}', LINE),
    "a boolean step": ('{"event": "step", "step": true, "loss": 1.0}', LINE),
    "a float step": ('{"event": "step", "step": 2.5, "loss": 1.0}', LINE),
    "a megabyte line": ('{"event": "step", "step": 9, "pad": "' + "x" * (1 << 20) + '"}', LINE),
    "a hundred-megabyte line": ("x" * (100 << 20), LINE),
    "deep nesting": ("[" * 100_000 + "]" * 100_000, LINE),
    "binary": ("\x00\x01\x02\udcff\udcfe", LINE),
    "control characters": ("\x00\x01\x02\xff\xfe", LINE),  # valid UTF-8, no JSON
    "text numbers": ('{"event": "step", "step": 5, "loss": "nan", "dt": 0.1}', ONE_VALUE),
    "numbers past a double": ('{"event": "step", "step": 5, "loss": 1e400, "dt": 0.1}',
                              ONE_VALUE),
    "NaN literals": ('{"event": "step", "step": 5, "loss": NaN, "dt": 0.1}', ONE_VALUE),
    "nested values": ('{"event": "step", "step": 5, "loss": {"a": [1]}, "dt": 0.1}', ONE_VALUE),
    "400-digit integers": ('{"event": "step", "step": 2, "loss": ' + "9" * 400 + ', "dt": '
                           + "1" * 400 + ', "tokens_per_s": -' + "7" * 400 + "}",
                           "3 values of step records that are"),
    # a step already recorded, again with every field damaged: the last record of a step wins
    "a recorded step with every kind of bad value": (
        '{"event": "step", "step": 1, "loss": "nan", "dt": "x", "mfu": "1", "lr": 1e400, '
        '"tokens_per_s": -1e400, "samples_per_s": NaN, "grad_norm": Infinity, '
        '"mem_gib": {"a": [1]}, "tokens": [0.1]}', "9 values of step records that are"),
}


@pytest.fixture
def metrics(sweep):
    """Job 1's metrics.jsonl; restored afterwards, whatever was put in its place."""
    path = Path(sweep[1][1]["run_dir"]) / "metrics.jsonl"
    kept = path.with_name("kept.jsonl")
    path.rename(kept)
    path.write_bytes(kept.read_bytes())
    yield path
    if path.is_dir():
        path.rmdir()
    else:
        path.unlink()
    kept.rename(path)


def _note(result) -> str:
    notes = [line for line in result.err.splitlines() if line.startswith("mmm-orch: note: ")]
    assert len(notes) == 1, result.err[-2000:]
    return notes[0]


@pytest.mark.slow
@pytest.mark.parametrize("kind", BAD_ROWS)
def test_a_damaged_row_is_left_out_and_counted_once(db_cli, metrics, tmp_path, kind):
    row, left_out = BAD_ROWS[kind]
    good = len(metrics.read_bytes().splitlines())
    metrics.write_bytes(metrics.read_bytes() + (row + "\n").encode("utf-8", "surrogateescape"))
    started = time.process_time()
    report = db_cli("report", "s1", "--out", str(tmp_path / "r"), "--json")
    assert report.code == 0, report.err[-2000:]
    assert time.process_time() - started < 2 * FAST
    note = _note(report)
    if left_out == LINE:
        assert f"job 1: 1 line of {metrics} that is no step record" in note, note
        assert f"first: line {good + 1})" in note, note
    else:
        assert f"job 1: {left_out} no finite number" in note, note
    assert "job 2" not in note
    rows = {r["job"]: r for r in json.loads(report.out)}
    assert rows[1]["steps"] and rows[2]["steps"], rows
    for key in ("step_ms", "final_loss", "throughput"):
        assert rows[1][key] is None or isinstance(rows[1][key], (int, float)), rows[1]
    plot = db_cli("plot", "1", "--out", str(tmp_path / "curve.png"))
    assert plot.code == 0, plot.err[-2000:]
    assert _note(plot) == note  # the same words for the one job


@pytest.mark.slow
def test_a_step_number_past_any_run_is_read_as_a_step(db_cli, metrics, tmp_path):
    """JSON's integers have no bound: a 29-digit step is still a step record, read into the
    table and the curve with nothing to note."""
    steps = metrics.read_text().count('"event": "step"')
    metrics.write_bytes(metrics.read_bytes()
                        + b'{"event": "step", "step": 99999999999999999999999999999, "dt": 0.1}\n')
    report = db_cli("report", "s1", "--out", str(tmp_path / "r"), "--json")
    assert report.code == 0 and "note" not in report.err, report.err[-2000:]
    row = {r["job"]: r for r in json.loads(report.out)}[1]
    assert row["steps"] == steps + 1, row
    for key in ("step_ms", "final_loss", "throughput"):
        assert row[key] is None or isinstance(row[key], (int, float)), row
    plot = db_cli("plot", "1", "--out", str(tmp_path / "curve.png"))
    assert plot.code == 0 and "note" not in plot.err, plot.err[-2000:]


@pytest.mark.slow
def test_a_file_past_the_read_bound_is_read_to_the_bound(db_cli, metrics, tmp_path):
    from mmm_orch.reporting.data import MAX_METRICS_LINES

    with metrics.open("ab") as out:
        out.write(b"x\n" * (MAX_METRICS_LINES + 10))
    started = time.process_time()
    plot = db_cli("plot", "1", "--out", str(tmp_path / "curve.png"))
    assert plot.code == 0, plot.err[-2000:]
    assert time.process_time() - started < 2 * FAST
    assert "all past its first 64 MiB or 500,000 lines" in _note(plot)


@pytest.mark.slow
@pytest.mark.timeout(HANG, func_only=True)
@pytest.mark.parametrize("kind", ["fifo", "directory", "nothing but damage"])
def test_metrics_with_no_step_record_cannot_be_plotted(db_cli, metrics, tmp_path, kind):
    metrics.unlink()
    if kind == "fifo":
        os.mkfifo(metrics)
    elif kind == "directory":
        metrics.mkdir()
    else:
        metrics.write_bytes(b"\xff\xfe\n[1]\n")
    line = refused_quietly(db_cli, tmp_path, "plot", "1", "--out", str(tmp_path / "c.png"),
                           fragments=["job 1 has no step metrics to plot"])
    if kind == "nothing but damage":
        assert "2 lines of" in line and "first: line 1" in line
    report = db_cli("report", "s1", "--out", str(tmp_path / "r"), "--json")
    assert report.code == 0, report.err[-2000:]
    assert {r["job"]: r for r in json.loads(report.out)}[1]["steps"] is None


# -- the job database, edited by hand -------------------------------------------------------------

BAD_SPECS = ["[1, 2]", '"points"', "{not json", "{}", '{"points": 3}', '{"points": [1, 2]}',
             '{"points": []}', '{"points": [{"nodes": "x"}, {"nodes": 1}]}',
             '{"points": [{"nodes": "x"}, {}]}',
             '{"points": [{"nodes": true}, {"nodes": 1}]}',
             '{"points": [{"nodes": 0}, {"nodes": 1}]}',
             '{"points": [{"nodes": 1, "epochs": {"a": 1}}, {"nodes": 1}]}',
             '{"points": [{"nodes": 1, "epochs": 1}, {"nodes": 1}]}',
             '{"points": [{"nodes": 1}]}',
             '{"points": [' + ", ".join(['{"nodes": 1}'] * 1001) + "]}"]


def _json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("spec", BAD_SPECS, ids=lambda s: s[:40])
def test_a_sweep_whose_points_were_edited_is_refused(db_cli, sweep, tmp_path, spec):
    original = _sql(sweep, "SELECT spec FROM groups WHERE id = 1")[0][0]
    try:
        _sql(sweep, "UPDATE groups SET spec = ? WHERE id = 1", spec)
        line = refused_quietly(db_cli, tmp_path, "report", "s1", "--out", str(tmp_path / "r"),
                               fragments=["damaged"])
        # a column that is no JSON object is the group's; the points in one are the sweep's
        assert ("sweep 1" if _json_object(spec) else "group 1's spec") in line, line
        status = db_cli("status", "--sweep", "1")
        assert status.code in (0, 2) and "Traceback" not in status.err, status.err
        assert "internal error" not in status.err
    finally:
        _sql(sweep, "UPDATE groups SET spec = ? WHERE id = 1", original)


@pytest.mark.slow
@pytest.mark.parametrize("index", [0, -1, 3, 10**12, None, "x"])
def test_a_job_whose_point_was_edited_is_refused(db_cli, sweep, tmp_path, index):
    try:
        _sql(sweep, "UPDATE jobs SET group_index = ? WHERE id = 2", index)
        refused_quietly(db_cli, tmp_path, "report", "s1", "--out", str(tmp_path / "r"),
                        fragments=["job 2 of sweep 1 is damaged"])
    finally:
        _sql(sweep, "UPDATE jobs SET group_index = 2 WHERE id = 2")


def _edits(plan: dict) -> dict[str, str]:
    """Each a plan as text: what a hand edit or another program could leave."""
    def changed(section: str, **fields) -> str:
        return json.dumps({**plan, section: {**plan[section], **fields}})
    group = plan["environment"]["groups"][0]
    return {
        "not JSON": "{not json", "a list": "[1, 2]", "a string": '"plan"',
        "a section missing": json.dumps({k: v for k, v in plan.items() if k != "layout"}),
        "another section missing": json.dumps({k: v for k, v in plan.items() if k != "queue"}),
        "a section as text": json.dumps({**plan, "launch": "mpiexec"}),
        "a field missing": json.dumps({**plan, "layout": {k: v for k, v in plan["layout"].items()
                                                          if k != "nodes"}}),
        "a number as text": changed("layout", nodes="2"),
        "a flag as a number": changed("environment", stage=1),
        "lines as a string": changed("environment", setup="rm -rf ~"),
        "mesh a list": changed("layout", mesh=[2, 1]),
        "mesh sizes as text": changed("layout", mesh={"dp": "2"}),
        "a line a number": changed("environment", setup=[1]),
        "a launcher word null": changed("launch", launcher=[None]),
        "an environment group as text": changed("environment", groups=["A=1"]),
        "an environment entry as a list": changed("environment",
                                                  groups=[{**group, "set": [["A", "1"]]}]),
        "a scheduler command a number": json.dumps({**plan, "scheduler_commands": {"submit": 3}}),
        "a device index as text": changed("devices", index=["0"]),
        "a trainer argument nested": changed("launch", args={"epochs": [1]}),
        "a trainer argument it does not take": changed("launch", args={"bogus": 1}),
        "trainer options as numbers": changed("launch", options=[1, 2]),
    }


PLAN_EDITS = list(_edits({section: {} for section in ("layout", "launch", "devices")}
                         | {"environment": {"groups": [{}]}}))
REPORT_READS = {"not JSON", "a list", "a string", "mesh a list", "mesh sizes as text"}


@pytest.mark.slow
@pytest.mark.parametrize("kind", PLAN_EDITS)
def test_a_record_whose_plan_was_edited(db_cli, sweep, tmp_path, kind):
    """rerun refuses every damaged plan; report and plot refuse what they read of it (a plan
    that is no JSON object, its mesh) and read the rest as the record's columns say."""
    original = _sql(sweep, "SELECT plan FROM jobs WHERE id = 1")[0][0]
    jobs = _jobs(sweep)
    try:
        _sql(sweep, "UPDATE jobs SET plan = ? WHERE id = 1", _edits(json.loads(original))[kind])
        refused_quietly(db_cli, tmp_path, "rerun", "1", fragments=["job 1", "damaged"])
        assert _jobs(sweep) == jobs  # nothing submitted
        report = db_cli("report", "s1", "--out", str(tmp_path / "r"), "--json")
        plot = db_cli("plot", "1", "--out", str(tmp_path / "c.png"))
        if kind in REPORT_READS:
            refused(report, "job 1", "damaged")
        else:
            assert report.code == 0, report.err[-2000:]
        for result in (report, plot):
            assert result.code in (0, 2), result.err[-2000:]
            assert "Traceback" not in result.err and "internal error" not in result.err
            if result.code == 2:
                refused(result, "job 1", "damaged")
    finally:
        _sql(sweep, "UPDATE jobs SET plan = ? WHERE id = 1", original)


@pytest.mark.slow
def test_the_reports_still_read_the_real_rows(db_cli, tmp_path):
    report = db_cli("report", "s1", "--out", str(tmp_path / "r"), "--json")
    assert report.code == 0, report.err
    assert "note" not in report.err  # nothing left out of an undamaged run
    rows = json.loads(report.out)
    assert len(rows) == 2 and all(r["steps"] and r["final_loss"] for r in rows), rows
    assert (tmp_path / "r" / "report.html").is_file()
    plot = db_cli("plot", "1", "--out", str(tmp_path / "c.png"))
    assert plot.code == 0 and (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    assert not list(tmp_path.glob(".c.tmp*"))  # written whole, then renamed


@pytest.mark.slow
@pytest.mark.parametrize("state", ["[1]", '"x"', "{" * 100_000, '{"progress": [1]}',
                                   '{"progress": {"1": 3}}', '{"progress": {"1": {"end_step": "x"}}}',
                                   '{"progress": {"1": {"end_step": true}}, "reason": 5}'])
@pytest.mark.parametrize("spec", ["whole", "edited"])
def test_a_damaged_chain_state_reads_as_no_progress(sweep, tmp_path, state, spec):
    """chain.json is written by the jobs (and so by anything in them): `status` shows the chain
    without its progress, never a crash."""
    from mmm_orch.submission import chains
    from mmm_orch.records.db import open_db

    (tmp_path / "chain.json").write_text(state)
    group = {"spec": {"remote": "", "dir": str(tmp_path), "links": 2} if spec == "whole" else {}}
    found = chains.summary(group, [open_db(str(sweep[0])).get(1)])
    assert found["note"].startswith("links 1/2" if spec == "whole" else "links 1/?"), found
    assert "step" not in found["note"]


@pytest.mark.slow
def test_a_plan_recorded_flat_by_an_older_mmm_orch_is_read_into_its_sections(db_cli, sweep, tmp_path):
    """Records written before the plan had sections hold it flat: rerun reads them into the
    same Plan, and the report finds their mesh."""
    from mmm_orch.planning.store import FLAT_NAMES, stored_plan

    original = _sql(sweep, "SELECT plan FROM jobs WHERE id = 1")[0][0]
    sectioned = json.loads(original)
    flat = {key: value for key, value in sectioned.items() if not isinstance(value, dict)
            or key == "scheduler_commands"}
    flat.update({old: sectioned[section][name] for old, (section, name) in FLAT_NAMES.items()})
    assert "layout" not in flat and flat["nodes"] == sectioned["layout"]["nodes"]
    # (an older record has no price: plans were priced later; its script ran in a login shell;
    # it names no software stack: profiles had none)
    now = stored_plan(sectioned, "sectioned")
    older = dataclasses.replace(now.environment, login_shell=True, stack="")
    assert stored_plan(flat, "flat") == dataclasses.replace(now, cost=None, environment=older)
    before = json.loads(db_cli("report", "s1", "--out", str(tmp_path / "a"), "--json").out)
    try:
        _sql(sweep, "UPDATE jobs SET plan = ? WHERE id = 1", json.dumps(flat))
        after = json.loads(db_cli("report", "s1", "--out", str(tmp_path / "b"), "--json").out)
    finally:
        _sql(sweep, "UPDATE jobs SET plan = ? WHERE id = 1", original)
    assert [row["mesh"] for row in after] == [row["mesh"] for row in before]


def test_the_module_s_tests_share_one_worker(request):
    """Under pytest-xdist's loadgroup (scripts/test.sh), this module's tests run on one worker, so
    the real sweep above is made once, not once per worker: xdist marks the group in the node
    id, which some pytest versions drop (see the pin in pyproject.toml)."""
    if not getattr(request.config.option, "loadgroup", False):
        return  # one process: every test of the module is on it
    assert request.node.nodeid.endswith("@hostile-sweeps"), request.node.nodeid
