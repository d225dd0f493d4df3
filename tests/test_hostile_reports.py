"""Reports, plots and reruns over damaged inputs: corrupt or foreign rows in a run's
metrics.jsonl, a FIFO or directory in its place, a sweep's stored points or a record's plan
edited by hand, an --out that is not what it must be. Rows that are not step records are left
out; damaged records end with exit 2 and one line; nothing hangs and nothing is a traceback.
One real sweep on the local executor, read by every test (each restores what it damaged)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from conftest import finished_local_sweep, run_cli

pytestmark = [pytest.mark.xdist_group("hostile-reports"), pytest.mark.slow]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("reports")
    env, rows = finished_local_sweep(root)
    return root, env, rows


def cli(sweep, *args: str, timeout: float = 300):  # a hang guard (see run_cli)
    root, env, _ = sweep
    return run_cli(*args, env=env, cwd=root, timeout=timeout)


# A FIFO opened for reading blocks forever: such a hang ends the command at this bound. A call
# takes about 1.5 s alone; on CI's 2 cores beside 5 busy workers, one took over 30 s.
HANG = 120


def refused(proc, *fragments: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mmm-orch: error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


BAD_ROWS = {
    "cut short": '{"event": "step", "step": 3, "loss": 1.',
    "not an object": "[1, 2, 3]",
    "a string step": '{"event": "step", "step": "x", "loss": 1.0, "dt": 0.1}',
    "a boolean step": '{"event": "step", "step": true, "loss": 1.0, "dt": 0.1}',
    "text numbers": '{"event": "step", "step": 1, "loss": "nan", "dt": "x", "mfu": "1"}',
    "numbers past a double": '{"event": "step", "step": 1, "loss": 1e400, "dt": -1e400}',
    "NaN literals": '{"event": "step", "step": 1, "loss": NaN, "dt": Infinity}',
    "nested values": '{"event": "step", "step": 1, "loss": {"a": [1]}, "dt": [0.1]}',
    "a huge step number": '{"event": "step", "step": 99999999999999999999999999999, "dt": 0.1}',
    "400-digit numbers": '{"event": "step", "step": 2, "loss": ' + "9" * 400 + ', "dt": '
                         + "1" * 400 + ', "tokens_per_s": -' + "7" * 400 + "}",
    "a megabyte line": '{"event": "step", "step": 1, "pad": "' + "x" * (1 << 20) + '"}',
    "deep nesting": "[" * 100_000 + "]" * 100_000,
    "binary": "\x00\x01\x02\xff\xfe",
}


@pytest.mark.parametrize("kind", BAD_ROWS)
def test_rows_that_are_not_step_records_are_left_out(sweep, kind, tmp_path):
    _, _, jobs = sweep
    metrics = Path(jobs[1]["run_dir"]) / "metrics.jsonl"
    original = metrics.read_bytes()
    try:
        metrics.write_bytes(original + (BAD_ROWS[kind] + "\n").encode("utf-8", "surrogateescape"))
        report = cli(sweep, "report", "s1", "--out", str(tmp_path / "r"), "--json")
        assert report.returncode == 0, report.stderr[-2000:]
        row = next(r for r in json.loads(report.stdout) if r["job"] == 1)
        for key in ("step_ms", "final_loss", "throughput"):
            assert row[key] is None or isinstance(row[key], (int, float)), row
        plot = cli(sweep, "plot", "1", "--out", str(tmp_path / "curve.png"))
        assert plot.returncode == 0, plot.stderr[-2000:]
    finally:
        metrics.write_bytes(original)


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_metrics_that_are_not_a_file_read_as_none(sweep, kind, tmp_path):
    _, _, jobs = sweep
    metrics = Path(jobs[2]["run_dir"]) / "metrics.jsonl"
    kept = metrics.with_name("kept.jsonl")
    metrics.rename(kept)
    try:
        os.mkfifo(metrics) if kind == "fifo" else metrics.mkdir()
        report = cli(sweep, "report", "s1", "--out", str(tmp_path / "r"), "--json", timeout=HANG)
        assert report.returncode == 0, report.stderr[-2000:]
        assert next(r for r in json.loads(report.stdout) if r["job"] == 2)["steps"] is None
    finally:
        metrics.unlink() if kind == "fifo" else metrics.rmdir()
        kept.rename(metrics)


def _edit(sweep, sql: str, *values) -> None:
    root, _, _ = sweep
    with sqlite3.connect(root / "state" / "mmm-orch" / "jobs.db") as conn:
        conn.execute(sql, values)


BAD_POINTS = ['{"points": 3}', '{"points": [1, 2]}', '{"points": [{"nodes": "x"}, {}]}', '{}',
              '{"points": []}']


@pytest.mark.parametrize("spec", BAD_POINTS)
def test_a_sweep_whose_stored_points_were_edited_is_refused(sweep, spec):
    root, _, _ = sweep
    with sqlite3.connect(root / "state" / "mmm-orch" / "jobs.db") as conn:
        original = conn.execute("SELECT spec FROM groups WHERE id = 1").fetchone()[0]
    try:
        _edit(sweep, "UPDATE groups SET spec = ? WHERE id = 1", spec)
        refused(cli(sweep, "report", "s1", "--json"), "sweep 1", "damaged")
    finally:
        _edit(sweep, "UPDATE groups SET spec = ? WHERE id = 1", original)


def _plan(sweep) -> dict:
    root, _, _ = sweep
    with sqlite3.connect(root / "state" / "mmm-orch" / "jobs.db") as conn:
        return json.loads(conn.execute("SELECT plan FROM jobs WHERE id = 1").fetchone()[0])


BAD_PLANS = {
    "not JSON": lambda plan: "{not json",
    "a list": lambda plan: "[1, 2]",
    "a section missing": lambda plan: json.dumps({k: v for k, v in plan.items() if k != "queue"}),
    "a number as text": lambda plan: json.dumps({**plan, "layout": {**plan["layout"], "nodes": "2"}}),
    "a flag as a number": lambda plan: json.dumps(
        {**plan, "environment": {**plan["environment"], "stage": 1}}),
    "lines as a string": lambda plan: json.dumps(
        {**plan, "environment": {**plan["environment"], "setup": "rm -rf ~"}}),
}


@pytest.mark.parametrize("kind", BAD_PLANS)
def test_a_record_whose_plan_was_edited_is_refused(sweep, kind):
    original = _plan(sweep)
    try:
        _edit(sweep, "UPDATE jobs SET plan = ? WHERE id = 1", BAD_PLANS[kind](original))
        refused(cli(sweep, "rerun", "1"), "job 1", "damaged")
        assert len(json.loads(cli(sweep, "status", "--all", "--json").stdout)) == 2  # no rerun
    finally:
        _edit(sweep, "UPDATE jobs SET plan = ? WHERE id = 1", json.dumps(original))


def test_plot_out_must_name_a_file(sweep, tmp_path):
    refused(cli(sweep, "plot", "1", "--out", str(tmp_path)), "--out", "is not a file")
    fifo = tmp_path / "fig.png"
    os.mkfifo(fifo)
    refused(cli(sweep, "plot", "1", "--out", str(fifo), timeout=HANG), "--out", "is not a file")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "work") == ["fig.png"]


@pytest.mark.parametrize("kind", ["file", "fifo"])
def test_report_out_must_be_a_directory(sweep, tmp_path, kind):
    out = tmp_path / "taken"
    os.mkfifo(out) if kind == "fifo" else out.write_text("mine\n")
    proc = cli(sweep, "report", "s1", "--out", str(out), timeout=HANG)
    refused(proc, "--out", "cannot make the directory")
    assert proc.stdout == ""  # nothing printed of a report that cannot be written
    if kind == "file":
        assert out.read_text() == "mine\n"


def test_a_report_the_disk_cannot_hold_is_written_whole_or_not_at_all(sweep, tmpfs):
    full = tmpfs("full", "size=24k")
    proc = cli(sweep, "report", "s1", "--out", str(full / "r"))
    refused(proc, "--out")
    assert list(full.iterdir()) == [], list(full.rglob("*"))  # no figure, no page, no dir


def test_the_reports_still_read_the_real_rows(sweep, tmp_path):
    report = cli(sweep, "report", "s1", "--out", str(tmp_path / "r"), "--json")
    assert report.returncode == 0, report.stderr
    rows = json.loads(report.stdout)
    assert len(rows) == 2 and all(r["steps"] and r["final_loss"] for r in rows), rows
    shutil.rmtree(tmp_path / "r")
