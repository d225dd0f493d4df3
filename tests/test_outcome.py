"""The files a job writes for mmm-orch (injob/protocol.py): failover.json, chain.json and the
outcome file. Each schema reads back what it writes, refuses anything else with one error
(truncated, foreign, of a wrong type or version), and `status` shows a job whose file is damaged
with a note, never a crash. The in-job programs write the outcome file as the launch ends (in
the job's directory, found from the log they write to), and `status` reads it before the log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.jobs import TERMINAL, wait_state
from helpers.profiles import write_spec
from hypothesis import given, settings
from hypothesis import strategies as st

from mmm_orch.injob import files, protocol
from mmm_orch.injob.files import (
    ChainBudget,
    ChainState,
    FailoverState,
    LinkProgress,
    Outcome,
    ProtocolFileError,
    ProtocolVersionError,
    RetiredNode,
)
from mmm_orch.records.db import JobDB

FAILOVER = FailoverState(2, 3, ("n1", "n3"), (), (RetiredNode("n2", "n2: shepherd died", False, 1),),
                         "node", "n2 lost its ranks")
CHAIN = ChainState(3, "/runs/r1", ("/usr/bin/scancel",), "stopped", "link 1 made no progress",
                   {1: LinkProgress(0, 100.0, None, 2, 160.5), 2: LinkProgress(0, 170.0)},
                   ChainBudget(10.0, 2, 3600, 1.5, 300, "elapsed", "node-hours"))
OUTCOME = Outcome(124, files.WHY_HUNG, "no step completed in 3s after step 1; last_step=1",
                  1, 0, 1700000000.5)
SCHEMAS = {FailoverState: FAILOVER, ChainState: CHAIN, Outcome: OUTCOME}
# What jobs wrote before the files had versions.
OLD_FAILOVER = ('{"attempt": 2, "attempts": 3, "active": ["n1"], "spares": [], "retired": '
                '[{"node": "n2", "blind": false, "evidence": "n2: shepherd died"}]}')
OLD_CHAIN = json.dumps({"links": 2, "run_dir": "/r", "cancel": ["scancel"], "status": "running",
                        "reason": "", "budget": None, "progress": {
                            "1": {"start_step": 0, "started": 5.0, "end_step": None,
                                  "exit_code": 1, "ended": 9.0}}})


# -- the schemas ---------------------------------------------------------------------------------

@pytest.mark.parametrize("value", SCHEMAS.values(), ids=lambda v: type(v).__name__)
def test_each_schema_reads_back_what_it_writes(value):
    text = value.to_json()
    assert type(value).from_json(text) == value
    assert type(value).from_json(text.encode()) == value  # as read from a host: bytes
    assert json.loads(text)["version"] == files.VERSION


def test_files_of_jobs_before_versions_are_read_as_version_1():
    failover = FailoverState.from_json(OLD_FAILOVER)
    assert failover.retired == (RetiredNode("n2", "n2: shepherd died", False),)
    assert failover.verdict is None and failover.version == 1
    chain = ChainState.from_json(OLD_CHAIN)
    assert chain.progress == {1: LinkProgress(0, 5.0, None, 1, 9.0)} and chain.budget is None


def _foreign(cls) -> list[str]:
    """Text of another kind of file, as each schema may be handed it."""
    others = [v.to_json() for k, v in SCHEMAS.items() if k is not cls]
    return [*others, "[1, 2]", '"x"', "null", "{}", '{"version": 1}', '{"attempt": 2}']


@pytest.mark.parametrize("cls", SCHEMAS, ids=lambda c: c.__name__)
def test_truncated_and_foreign_files_are_refused_with_one_error(cls):
    whole = SCHEMAS[cls].to_json()
    for text in [whole[:len(whole) // 2], whole[:1], "", *_foreign(cls),
                 "{" * 100_000, b"\xff\xfe{}", "\u0000"]:
        with pytest.raises(ProtocolFileError):
            cls.from_json(text)


@pytest.mark.parametrize("cls, key, wrong", [
    (FailoverState, "attempt", "2"), (FailoverState, "attempt", True),
    (FailoverState, "active", "n1"), (FailoverState, "active", [1]),
    (FailoverState, "retired", [{"node": "n2", "evidence": "e", "blind": "no"}]),
    (FailoverState, "retired", [{"node": "n2"}]), (FailoverState, "verdict", 3),
    (ChainState, "links", 2.0), (ChainState, "status", "paused"), (ChainState, "cancel", "scancel"),
    (ChainState, "progress", [1]), (ChainState, "progress", {"one": {"start_step": 0}}),
    (ChainState, "progress", {"1": {"start_step": "0"}}),
    (ChainState, "budget", {"limit": 1}), (ChainState, "budget", {
        **json.loads(CHAIN.to_json())["budget"], "charged_for": "queued"}),
    (Outcome, "exit_code", 1.5), (Outcome, "why", "bored"), (Outcome, "last_step", "7"),
    (Outcome, "ended_at", "NaN"),
])
def test_a_field_of_the_wrong_type_is_refused(cls, key, wrong):
    data = json.loads(SCHEMAS[cls].to_json())
    data[key] = wrong
    with pytest.raises(ProtocolFileError):
        cls.from_json(json.dumps(data))


def test_the_error_names_the_file_and_the_field():
    with pytest.raises(ProtocolFileError, match=r"^failover\.json: 'attempt' is not int: '2'$"):
        FailoverState.from_json(OLD_FAILOVER.replace('"attempt": 2', '"attempt": "2"'))


@pytest.mark.parametrize("cls", SCHEMAS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("version", [2, 0, "1", None, True])
def test_a_version_this_mmm_orch_does_not_read_is_refused_saying_so(cls, version):
    data = {**json.loads(SCHEMAS[cls].to_json()), "version": version}
    with pytest.raises(ProtocolVersionError, match="this mmm-orch reads version 1"):
        cls.from_json(json.dumps(data))
    assert "another mmm-orch" in files.unreadable("x.json", ProtocolVersionError("x.json: v"))


def test_the_outcome_file_must_say_its_version_and_numbers_must_be_finite():
    data = json.loads(OUTCOME.to_json())
    del data["version"]
    with pytest.raises(ProtocolVersionError):
        Outcome.from_json(json.dumps(data))
    with pytest.raises(ProtocolFileError):
        Outcome.from_json(OUTCOME.to_json().replace("1700000000.5", "NaN"))


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=12), inner, max_size=6), max_leaves=20)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(value=JSON, base=st.sampled_from(list(SCHEMAS.values())), key=st.text(max_size=12))
def test_whatever_a_job_wrote_is_read_or_refused_never_a_crash(value, base, key):
    """Any JSON, alone or put in a real file's place of any key: the schema or its one error."""
    data = json.loads(base.to_json())
    for text in (json.dumps(value), json.dumps({**data, key: value})):
        try:
            read = type(base).from_json(text)
        except ProtocolFileError:
            continue
        assert isinstance(read, type(base))


def test_writes_are_whole_or_not_at_all(tmp_path):
    path = tmp_path / "job" / "outcome.json"
    path.parent.mkdir()
    protocol.write_atomically(path, OUTCOME.to_json())
    assert Outcome.from_json(path.read_text()) == OUTCOME
    assert [p.name for p in path.parent.iterdir()] == ["outcome.json"]  # no partial file left


def test_a_chain_budget_charges_as_a_plan_is_priced():
    """One formula: a chain's links price themselves with protocol.charge, as plans are priced
    (planning's CostPlan.charge must agree with it, share and all)."""
    from mmm_orch.planning.model import CostPlan

    for charged_for in ("elapsed", "walltime"):
        for nodes, seconds, minimum, share in [(2, 100, 300, 1.0), (4, 7200.5, 0, 0.5),
                                               (1, 0, 60, 1.0)]:
            plan = CostPlan(unit="node-hours", nodes=nodes, spare_nodes=0, walltime=3600,
                            factor=1.5, charged_for=charged_for, minimum=minimum, share=share)
            assert plan.charge(nodes, seconds) == protocol.charge(
                nodes, seconds, walltime=3600, charged_for=charged_for, minimum=minimum,
                factor=1.5, share=share)
            if share == 1.0:
                budget = ChainBudget(10, nodes, 3600, 1.5, minimum, charged_for, "node-hours")
                assert budget.charge(seconds) == plan.charge(nodes, seconds)


# -- the in-job programs write the outcome file -------------------------------------------------

def _logged(job_dir: Path, argv: list[str], log_name: str = protocol.LOG_FILE) -> int:
    """Run an in-job program as the job script does: its stdout the job's log in `job_dir`."""
    job_dir.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != protocol.RUN_DIR_VAR}
    with open(job_dir / log_name, "ab") as log:
        return subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=60,
                              env=env).returncode


def _outcome(job_dir: Path) -> Outcome:
    return Outcome.from_json((job_dir / protocol.OUTCOME_FILE).read_text())


WATCHDOG = [sys.executable, "-m", "mmm_orch.injob.watchdog", "--first-step-timeout", "2",
            "--step-timeout", "2", "--grace", "2", "--"]


@pytest.mark.parametrize("line, code, why, detail, last, saved", [
    ("echo step=1; echo step=2", 0, files.WHY_COMPLETED, "the launch finished", 2, None),
    ("echo step=1; exit 3", 3, files.WHY_FAILED, "the launch exited 3", 1, None),
    # Two ranks that each print their steps, interleaved: the furthest step is the last.
    ("echo step=5; echo step=4; exit 1", 1, files.WHY_FAILED, "the launch exited 1", 5, None),
    pytest.param("echo step=1; sleep 300", 124, files.WHY_HUNG,
                 "no step completed in 2s after step 1; last_step=1", 1, None,
                 marks=pytest.mark.slow),  # waits out the watchdog's 2 s
    ("echo step=4; echo '[checkpoint] step=4 path=x save_s=0.1'; exit 75", 75,
     files.WHY_CHECKPOINTED, "saved a checkpoint before the walltime", 4, 4),
])
def test_the_watchdog_writes_the_outcome_beside_the_log(tmp_path, line, code, why, detail, last,
                                                       saved):
    job_dir = tmp_path / "job dir"
    assert _logged(job_dir, [*WATCHDOG, line]) == code
    got = _outcome(job_dir)
    assert (got.exit_code, got.why, got.detail) == (code, why, detail)
    assert (got.last_step, got.saved_step) == (last, saved)


@pytest.mark.parametrize("launch", [
    "echo step=31; touch {ready}; sleep 300",
    # MPICH's mpiexec exits 0 once the ranks it passed a SIGTERM to have gone: still a stop
    "trap 'exit 0' TERM; echo step=31; touch {ready}; sleep 300 & wait",
])
def test_the_watchdog_says_a_stop_by_the_scheduler_and_the_run_s_checkpoint(tmp_path, launch):
    run_dir = tmp_path / "run"
    (run_dir / protocol.CHECKPOINTS_DIR).mkdir(parents=True)
    protocol.point_latest(run_dir, 30)
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    with open(job_dir / protocol.LOG_FILE, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mmm_orch.injob.watchdog",
                                 "--first-step-timeout", "60", "--step-timeout", "60", "--",
                                 launch.format(ready=tmp_path / "ready")],
                                stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, protocol.RUN_DIR_VAR: str(run_dir)})
    deadline = time.monotonic() + 30
    while not (tmp_path / "ready").exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    got = _outcome(job_dir)
    assert (got.why, got.detail, got.last_step, got.saved_step) == (
        files.WHY_STOPPED, "stopped by SIGTERM", 31, 30)  # the run's newest checkpoint


def test_without_a_job_log_there_is_no_outcome_file(tmp_path):
    """Run by hand (a pipe, a terminal, a file of another name): nowhere to write, nothing
    written; the job's log, by its name, is what marks the job's directory."""
    here = tmp_path / "here"
    here.mkdir()
    proc = subprocess.run([*WATCHDOG, "echo step=1"], capture_output=True, timeout=60, cwd=here)
    assert proc.returncode == 0 and not list(here.iterdir())
    assert _logged(here, [*WATCHDOG, "echo step=1"], log_name="other.log") == 0
    assert [p.name for p in here.iterdir()] == ["other.log"]


def test_failover_writes_the_outcome_in_its_directory(tmp_path):
    (tmp_path / protocol.NODES_FILE).write_text("n1\nn2\n")
    proc = subprocess.run(
        [sys.executable, "-m", "mmm_orch.injob.failover", "--dir", str(tmp_path), "--machine",
         "slurm-local", "--active", "2", "--node-arg=--nodelist={nodelist}",
         "--first-step-timeout", "60", "--step-timeout", "60", "--", "echo step=5 @NODES@"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = _outcome(tmp_path)
    assert (got.exit_code, got.why, got.last_step) == (0, files.WHY_COMPLETED, 5)
    state = FailoverState.from_json((tmp_path / protocol.FAILOVER_FILE).read_text())
    assert (state.attempt, state.active, state.verdict) == (1, ("n1", "n2"), "success")


def test_failover_s_own_failure_is_an_outcome_too(tmp_path):
    (tmp_path / protocol.NODES_FILE).write_text("n1\n")
    proc = subprocess.run(
        [sys.executable, "-m", "mmm_orch.injob.failover", "--dir", str(tmp_path), "--machine",
         "slurm-local", "--active", "2", "--node-arg=x", "--first-step-timeout", "60",
         "--step-timeout", "60", "--", "true"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == protocol.EXIT_INTERNAL_ERROR
    got = _outcome(tmp_path)
    assert got.why == files.WHY_FAILED and "fewer than the 2 to launch on" in got.detail


def test_a_chain_link_that_does_not_run_says_so_in_its_outcome(tmp_path):
    chain = tmp_path / "chain" / protocol.CHAIN_FILE
    chain.parent.mkdir()
    chain.write_text(ChainState(3, str(tmp_path / "run"), ("true",), "finished",
                                "the training finished in link 1/3").to_json())
    job_dir = tmp_path / "job"
    argv = [sys.executable, "-m", "mmm_orch.injob.chain", "begin", "--chain", str(chain),
            "--link", "2"]
    assert _logged(job_dir, argv) == protocol.EXIT_CHAIN_SKIP
    got = _outcome(job_dir)
    assert (got.exit_code, got.why) == (protocol.EXIT_CHAIN_SKIP, files.WHY_CHAIN_SKIPPED)
    assert got.detail == ("link 2/3 skipped: the chain finished (the training finished in link "
                          "1/3)")
    assert got.detail in (job_dir / protocol.LOG_FILE).read_text()
    chain.write_text(CHAIN.to_json()[:40])  # damaged: one line saying so, no traceback
    assert _logged(job_dir, argv) == 1
    assert "chain.json: not JSON" in (job_dir / protocol.LOG_FILE).read_text()
    assert "Traceback" not in (job_dir / protocol.LOG_FILE).read_text()


def test_a_chain_link_after_one_without_progress_is_skipped_and_said(tmp_path):
    chain = tmp_path / protocol.CHAIN_FILE
    chain.write_text(ChainState(3, str(tmp_path / "run"), ("true",),
                                progress={1: LinkProgress(0, time.time() - 60)}).to_json())
    job_dir = tmp_path / "job"
    assert _logged(job_dir, [sys.executable, "-m", "mmm_orch.injob.chain", "begin", "--chain",
                             str(chain), "--link", "2"]) == protocol.EXIT_CHAIN_SKIP
    assert _outcome(job_dir).detail.startswith("link 2/3 skipped: link 1 made no progress")
    state = ChainState.from_json(chain.read_text())
    assert state.status == "stopped" and state.reason.startswith("link 1 made no progress")



def test_a_link_that_stops_the_chain_cancels_only_the_later_links_and_ends_it_first(tmp_path):
    """Link 2 finds link 1 made no progress: it cancels links 3 and 4, never its own job (a
    scheduler's cancel of it would kill this very process). The chain's end is written before any
    cancel: the cancel command here kills the process that runs it, as a cancel of its own job
    would, and the links after still skip."""
    chain = tmp_path / protocol.CHAIN_FILE
    cancel = tmp_path / "cancel"
    cancel.write_text('#!/bin/sh\necho "$1" >> "$(dirname "$0")/cancelled"\nkill -KILL $PPID\n')
    cancel.chmod(0o755)
    chain.write_text(ChainState(4, str(tmp_path / "run"), (str(cancel),),
                                progress={1: LinkProgress(0, time.time() - 60)}).to_json())
    for link in range(1, 5):
        (tmp_path / f"link-{link}.id").write_text(f"10{link}\n")
    argv = [sys.executable, "-m", "mmm_orch.injob.chain", "begin", "--chain", str(chain)]
    assert _logged(tmp_path / "job2", [*argv, "--link", "2"]) == -signal.SIGKILL
    assert (tmp_path / "cancelled").read_text() == "103\n"  # the first after its own
    state = ChainState.from_json(chain.read_text())
    assert state.status == "stopped" and state.reason.startswith("link 1 made no progress")
    assert _logged(tmp_path / "job4", [*argv, "--link", "4"]) == protocol.EXIT_CHAIN_SKIP


# -- status: the outcome first, the log for jobs without one, a damaged file noted --------------

def _db() -> JobDB:
    return JobDB(Path(os.environ["XDG_STATE_HOME"]) / "mmm-orch" / "jobs.db")


def _ended_job(db: JobDB, job_dir: Path, exit_code: int, log: str = "", **values) -> int:
    """A local job the records hold as running, which its supervisor recorded as ended."""
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / protocol.LOG_FILE).write_text(log)
    (job_dir / protocol.RESULT_FILE).write_text(json.dumps({
        "exit_code": exit_code, "signal": None, "cancelled": False, "timed_out": False,
        "ended_at": time.time()}))
    return db.insert(**{
        "machine": "local", "host": "h", "scheduler": "local", "commands": {}, "workload": "w",
        "name": "w", "nodes": 1, "ranks": 1, "native_id": job_dir.name, "job_dir": str(job_dir),
        "script_path": "s", "script": "", "plan": {}, "submit_dir": str(job_dir),
        "git_commit": None, "log_path": str(job_dir / protocol.LOG_FILE),
        "submitted_at": time.time(), "state": "running", **values})


def _row(cli, job: int) -> dict:
    result = cli("status", str(job), "--json")
    assert result.code == 0, result.err
    return json.loads(result.out)[0]


def test_a_truncated_outcome_file_is_a_note_and_the_log_is_read(cli, isolated):
    job = _ended_job(_db(), isolated / "job", 124, log="[mmm-orch] hung: no first step within "
                     "9s of launch; last_step=none; stopping the launch (SIGTERM, SIGKILL)\n")
    (isolated / "job" / protocol.OUTCOME_FILE).write_text(OUTCOME.to_json()[:25])
    row = _row(cli, job)
    assert row["state"] == "hung", row  # from the log
    assert row["reason"] == ("outcome.json is not as the job writes it (truncated or changed): "
                             "read from the log; no first step within 9s of launch; "
                             "last_step=none")
    table = cli("status")
    assert table.code == 0 and "outcome.json is not as the job writes it" in table.out


def test_a_truncated_failover_file_is_a_note_on_the_job(cli, isolated):
    job = _ended_job(_db(), isolated / "job", 1, spares=1)
    (isolated / "job" / protocol.FAILOVER_FILE).write_text(FAILOVER.to_json()[:30])
    row = _row(cli, job)
    assert row["state"] == "failed" and row["reason"] == (
        "failover.json is not as the job writes it (truncated or changed): its attempts are not "
        "shown"), row
    table = cli("status")
    assert table.code == 0 and "failover.json is not as the job writes it" in table.out


def test_a_truncated_chain_file_is_a_note_on_the_chain(cli, isolated):
    db = _db()
    chain_dir = isolated / "chain"
    chain_dir.mkdir()
    (chain_dir / protocol.CHAIN_FILE).write_text(CHAIN.to_json()[:50])
    group = db.groups.new("chain", {"links": 2, "dir": str(chain_dir), "remote": ""})
    _ended_job(db, isolated / "job", 2, group_id=group, group_index=1)
    table = cli("status")
    assert table.code == 0, table.err
    line = next(line for line in table.out.splitlines() if "chain.json" in line)
    assert line.split()[0] == f"c{group}", table.out
    assert "links 1/2: chain.json is not as the jobs write it" in line, table.out


def test_status_reads_the_outcome_before_the_log(cli, isolated):
    """What the outcome file says wins over the log: a job whose log says nothing of its end."""
    db = _db()
    hung = _ended_job(db, isolated / "hung", 124, log="step=1\n")
    files.write_outcome(OUTCOME, isolated / "hung")
    skipped = _ended_job(db, isolated / "skip", 0, log="")
    files.write_outcome(Outcome(10, files.WHY_CHAIN_SKIPPED, "link 2/3 skipped: x"),
                           isolated / "skip")
    saved = _ended_job(db, isolated / "saved", 75, log="")
    files.write_outcome(Outcome(75, files.WHY_CHECKPOINTED, "", 12, 10), isolated / "saved")
    stopped = _ended_job(db, isolated / "stop", 143, log="")
    files.write_outcome(Outcome(143, files.WHY_STOPPED, "stopped by SIGTERM"),
                           isolated / "stop")
    assert (_row(cli, hung)["state"], _row(cli, hung)["reason"]) == ("hung", OUTCOME.detail)
    assert (_row(cli, skipped)["state"], _row(cli, skipped)["reason"]) == (
        "cancelled", "link 2/3 skipped: x")
    assert (_row(cli, saved)["state"], _row(cli, saved)["reason"]) == (
        "timeout", "resumable at step 10 (saved before the walltime)")
    assert (_row(cli, stopped)["state"], _row(cli, stopped)["reason"]) == (
        "cancelled", "stopped by SIGTERM")


@pytest.mark.slow
def test_a_real_local_job_writes_its_outcome_and_status_reads_it(cli, isolated):
    """A command that hangs after its first step, under the watchdog: the outcome file is there
    when the job has ended, and `status` takes the hang from it (the log is emptied first)."""
    write_spec(isolated, "stuck", "name: stuck\nwatchdog: {first_step_timeout: 30, "
               "step_timeout: 3}\n")
    code = "import time; print('step=1', flush=True); time.sleep(600)"
    submitted = cli("submit", "local", "stuck", "--json", "--", sys.executable, "-c", code)
    assert submitted.code == 0, submitted.err
    job_dir = Path(json.loads(submitted.out)["job_dir"])
    deadline = time.monotonic() + 120
    while not (job_dir / protocol.RESULT_FILE).exists():  # ended, status not asked yet
        assert time.monotonic() < deadline, (job_dir / protocol.LOG_FILE).read_text()
        time.sleep(0.5)
    got = _outcome(job_dir)
    assert (got.exit_code, got.why, got.last_step) == (124, files.WHY_HUNG, 1)
    (job_dir / protocol.LOG_FILE).write_text("")
    row = wait_state(cli, 1, TERMINAL)
    assert (row["state"], row["exit_code"], row["reason"]) == (
        "hung", 124, "no step completed in 3s after step 1; last_step=1"), row
