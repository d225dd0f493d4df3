"""Hostile numbers, records, files and places reaching the orchestrator: sizes and budgets past a
float's range, a profile's NaN device memory or empty balance command, tampered job records,
a sweep's node axis given with --set, a job log that is a directory, a user template that raises,
a cache that cannot be written, a backup that cannot be made, and a global batch the trainer
would refuse. Each is one line and exit 2 (or, for a cache, nothing at all), nothing written."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from helpers.cli import run_cli
from helpers.jobs import assert_nothing_recorded, wait_state
from helpers.profiles import write_machine

HUGE = "9" * 401


def state_dir() -> Path:
    return Path(os.environ["XDG_STATE_HOME"]) / "mmm-orch"


def one_line(result, *fragments: str) -> str:
    assert result.code == 2, (result.code, result.out[-300:], result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mmm-orch: error: "), result.err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def ended_job(cli, *options: str) -> int:
    """A real local job that ran `true` to its end (so it was charged); its id."""
    result = cli("submit", "local", "--no-env-check", "--json", *options, "--", "true")
    assert result.code == 0, result.err
    job = json.loads(result.out)["id"]
    assert wait_state(cli, job)["state"] == "completed"
    return job


def tamper(job: int, column: str, value) -> None:
    with sqlite3.connect(state_dir() / "jobs.db") as conn:
        conn.execute(f"UPDATE jobs SET {column} = ? WHERE id = ?", (value, job))


# -- sizes and budgets --------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["seq_len", "batch_size", "n_layers", "vocab_size", "global_batch"])
def test_a_size_past_a_float_is_refused_naming_it(cli, name):
    line = one_line(cli("render", "local", "llama3_debug", "--set", f"{name}={HUGE}"),
                    f"{name} (an integer of 401 digits) is invalid", "a whole number from")
    assert len(line) < 200


def test_a_budget_of_401_digits_is_refused_when_read(cli, isolated):
    config = isolated.parent / "config" / "mmm-orch"
    config.mkdir(parents=True)
    (config / "budgets.yaml").write_text(f"budgets:\n  - {{account: p, node_hours: {HUGE}}}\n")
    one_line(cli("submit", "local", "-A", "p", "--no-env-check", "--", "true"),
             "budgets[0].node_hours (an integer of 401 digits) is invalid: a number >= 0")
    assert not state_dir().exists()


@pytest.mark.parametrize("value", [".nan", ".inf", "-1", "0"])
def test_a_device_memory_that_is_not_a_positive_number_is_refused_when_loaded(cli, isolated, value):
    write_machine(isolated, "gpu", f"extends: local\nname: gpu\nnode: {{gpu_memory_gib: {value}}}\n")
    one_line(cli("render", "gpu", "llama3_debug"), "node.gpu_memory_gib",
             "expected a finite number more than 0")


def test_an_empty_balance_command_is_refused_when_loaded(cli, isolated):
    write_machine(isolated, "bal", "extends: local\nname: bal\n"
                  "charging: {balance: {command: [], parser: sbank}}\n")
    for argv in (["balance", "bal", "-A", "p"], ["render", "bal", "dist_check"]):
        one_line(cli(*argv), "balance.command []", "at least one word")


# -- the global batch ---------------------------------------------------------------------------

def test_a_global_batch_the_ranks_cannot_split_is_refused_before_anything_is_written(cli):
    # local: 2 ranks, batch_size 8 a rank: a step's samples come 16 at a time.
    one_line(cli("submit", "local", "llama3_debug", "--set", "global_batch=8", "--no-env-check"),
             "global_batch 8 is invalid",
             "a multiple of batch_size 8 x 2 data-parallel ranks = 16")
    assert not state_dir().exists()
    # With tp=2 the two ranks are one data-parallel rank: 8 is one micro-batch.
    assert cli("render", "local", "llama3_debug", "--set", "tp=2", "--set", "global_batch=8").code == 0


def test_the_plan_refuses_exactly_what_the_trainer_refuses(cli):
    from mmm_orch.runtime.data import GlobalBatch

    for batch, global_batch in [(8, 0), (8, 16), (8, 48), (8, 24), (4, 8), (4, 12), (3, 18)]:
        try:
            GlobalBatch.of(global_batch, batch, 2, 0)
            trainer = 0
        except ValueError:
            trainer = 2
        result = cli("render", "local", "llama3_debug", "--set", f"batch_size={batch}",
                     "--set", f"global_batch={global_batch}")
        assert result.code == trainer, (batch, global_batch, result.err)


# -- tampered job records -----------------------------------------------------------------------

@pytest.mark.slow
def test_a_tampered_record_is_refused_by_usage_and_budgets_in_one_line(cli, isolated):
    job = ended_job(cli, "-A", "p")
    assert json.loads(cli("usage", "--json").out)[0]["jobs"] == 1
    cases = [("ended_at", 1e300, ["usage", "--by", "day"]),
             ("charge", "abc", ["usage"]),
             ("charged_seconds", -5.0, ["usage"]),
             ("charged_nodes", 2.5, ["usage", "--by", "workload"])]
    for column, value, argv in cases:
        with sqlite3.connect(state_dir() / "jobs.db") as conn:
            before = conn.execute(f"SELECT {column} FROM jobs WHERE id = ?", (job,)).fetchone()[0]
        tamper(job, column, value)
        one_line(cli(*argv), f"job {job}'s {column}", "changed by hand")
        tamper(job, column, before)
    # A budget cannot count a charge it cannot read: the plan is refused, not passed.
    config = isolated.parent / "config" / "mmm-orch"
    config.mkdir(parents=True)
    (config / "budgets.yaml").write_text("budgets:\n  - {account: p, node_hours: 100}\n")
    tamper(job, "charge", "abc")
    one_line(cli("submit", "local", "-A", "p", "--dry-run", "--", "true"), f"job {job}'s charge")
    tamper(job, "charge", 0.0)
    assert cli("usage", "--by", "day").code == 0


def test_a_recorded_plan_whose_rules_were_tampered_is_priced_as_plain_node_hours(cli, isolated):
    config = isolated.parent / "config" / "mmm-orch"
    config.mkdir(parents=True)
    (config / "budgets.yaml").write_text("budgets:\n  - {account: p, node_hours: 1.5}\n")
    held = cli("submit", "local", "-A", "p", "--walltime", "00:30:00", "--no-env-check", "--json",
               "--", "sleep", "60")
    assert held.code == 0, held.err
    job = json.loads(held.out)["id"]
    try:
        with sqlite3.connect(state_dir() / "jobs.db") as conn:
            plan = json.loads(conn.execute("SELECT plan FROM jobs WHERE id = ?", (job,)).fetchone()[0])
            plan["cost"]["walltime"] = int(HUGE)
            conn.execute("UPDATE jobs SET plan = ? WHERE id = ?", (json.dumps(plan), job))
        # Held as an open job with no rules can: its nodes for an hour, 1 of the 1.5.
        review = cli("submit", "local", "-A", "p", "--walltime", "00:40:00", "--dry-run", "--",
                     "true")
        one_line(review, "up to 1.00 held by open jobs leave 0.50")
    finally:
        cli("cancel", str(job))


# -- a sweep's node axis ------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["abc", "1,abc", "0", "1.5", "١"])
def test_a_node_count_given_with_set_is_checked_as_nodes_is(cli, value):
    one_line(cli("sweep", "local", "dist_check", "--set", f"nodes={value}", "--dry-run"),
             "--set nodes", "node counts are whole numbers")
    assert not state_dir().exists()


# -- a job log that is a directory --------------------------------------------------------------

@pytest.fixture
def log_is_a_directory(cli):
    job = ended_job(cli)
    log = Path(json.loads(cli("status", str(job), "--json").out)[0]["log_path"])
    log.unlink()
    log.mkdir()
    return job


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["diagnose"], ["timeline"], ["logs", "--tail", "5"]])
def test_a_log_that_is_a_directory_is_no_log(cli, log_is_a_directory, argv):
    result = cli(argv[0], str(log_is_a_directory), *argv[1:])
    assert "internal error" not in result.err and "Traceback" not in result.err, result.err
    if argv[0] == "diagnose":
        one_line(result, "has no log")
    elif argv[0] == "timeline":
        assert result.code == 0 and "no log yet" in result.out, result
    else:
        assert result.code == 0 and result.out == "", result
    assert cli("startup").code == 0


@pytest.mark.slow
def test_logs_of_a_log_that_is_a_directory(cli, log_is_a_directory):
    assert "internal error" not in cli("logs", str(log_is_a_directory)).err


# -- user templates that raise ------------------------------------------------------------------

@pytest.mark.parametrize("expression,said", [
    ("1 / 0", "division by zero"),
    ("'a' + 1", "can only concatenate str"),
    ("'%d' % 'a'", "a real number is required"),
    ("10 ** 400 / 1.0", "int too large to convert to float"),
    ("(1e308 * 10) | int", "cannot convert float infinity to integer")])
def test_a_template_that_raises_is_one_line_naming_it_and_its_line(cli, isolated, expression, said):
    templates = isolated / ".mmm-orch" / "templates"
    templates.mkdir(parents=True)
    (templates / "local.sh.j2").write_text("#!/bin/bash\n{% include 'part.j2' %}\n")
    (templates / "part.j2").write_text(f"# one\n# two\n{{{{ {expression} }}}}\n")
    one_line(cli("render", "local", "dist_check"), f"{templates / 'part.j2'}:3: template error",
             said)
    one_line(cli("submit", "local", "dist_check", "--no-env-check"), "part.j2:3")
    assert_nothing_recorded()


# -- a cache that cannot be used ----------------------------------------------------------------

def _render(isolated: Path, cache: Path) -> subprocess.CompletedProcess:
    """In a fresh interpreter: the caches are chosen once per process."""
    return run_cli("render", "local", "dist_check", cwd=isolated, env={"XDG_CACHE_HOME": str(cache)})


@pytest.mark.slow
def test_a_cache_home_that_is_a_file_is_skipped(isolated, tmp_path):
    expected = _render(isolated, tmp_path / "cache")
    assert expected.returncode == 0, expected.stderr
    (tmp_path / "plain-file").write_text("not a directory")
    proc = _render(isolated, tmp_path / "plain-file")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout == expected.stdout
    assert (tmp_path / "plain-file").read_text() == "not a directory"


def test_a_full_cache_disk_is_skipped(isolated, tmpfs):
    full = tmpfs("full", "size=64k")
    subprocess.run(["dd", "if=/dev/zero", f"of={full / 'filler'}", "bs=4k"],
                   capture_output=True)
    with pytest.raises(OSError):  # the disk really is full
        (full / "probe").write_bytes(b"x" * 4096)
    (full / "probe").unlink(missing_ok=True)
    proc = _render(isolated, full)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith("#!/bin/bash")
    left = [p for p in full.rglob("*") if p.is_file() and p.name != "filler"]
    assert left == [], left  # no half-written entry


# -- the job database ---------------------------------------------------------------------------

@pytest.mark.slow
def test_a_backup_that_cannot_be_written_is_not_claimed(cli):
    ended_job(cli)
    backup = state_dir() / "jobs.db.backup"
    backup.unlink()
    backup.mkdir()
    result = cli("db", "backup")
    one_line(result, f"backup {backup}: not written", "Is a directory")
    assert result.out == "" and list(backup.iterdir()) == []
    backup.rmdir()
    done = cli("db", "backup")
    assert done.code == 0 and done.out == f"backed up to {backup}\n"
    with sqlite3.connect(backup) as conn:
        assert conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 1


@pytest.mark.slow
def test_db_check_of_a_damaged_database_is_a_finding_not_a_bug(cli):
    ended_job(cli)
    (state_dir() / "jobs.db").write_bytes(b"")
    result = cli("db", "check")
    one_line(result, "needs recovery", "mmm-orch db recover")
    assert "NEEDS RECOVERY" in result.out
    assert cli("db", "recover").code == 0
    assert cli("db", "check").code == 0
