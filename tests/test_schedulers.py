"""Scheduler verbs: argument lists, batching, retries, refusals, against commands that replay
recorded scheduler output; the live servers run in test_slurm_cluster.py and test_pbs_server.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from helpers import REPO
from helpers.jobs import assert_nothing_recorded
from helpers.profiles import write_machine

from mmm_orch.errors import SchedulerError, SchedulerUnavailable
from mmm_orch.hosts import transport
from mmm_orch.hosts.transport import LocalRunner, Retry, run_command
from mmm_orch.schedulers import scheduler_for
from mmm_orch.schedulers.base import JobRef, Submission
from mmm_orch.schedulers.pbs.scheduler import statuses_for
from mmm_orch.schedulers.slurm import parse as slurm_parse
from mmm_orch.schedulers.states import JobState

FIXTURES = REPO / "tests" / "fixtures"
FAST = Retry(attempts=4, first_delay=0.05, max_delay=0.1, deadline=10, timeout=5)


def replaying_command(directory: Path, name: str, stdout: str = "", stderr: str = "",
                      code: int = 0) -> Path:
    """An executable `name` that records its argv (one JSON list per call) and replays output."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.out").write_text(stdout)
    (directory / f"{name}.err").write_text(stderr)
    path = directory / name
    path.write_text(
        "#!/usr/bin/env python3\nimport json, sys\n"
        f"with open({str(directory / (name + '.calls'))!r}, 'a') as f:\n"
        "    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"sys.stdout.write(open({str(directory / (name + '.out'))!r}).read())\n"
        f"sys.stderr.write(open({str(directory / (name + '.err'))!r}).read())\n"
        f"sys.exit({code})\n")
    path.chmod(0o755)
    return path


def calls(directory: Path, name: str) -> list[list[str]]:
    path = directory / f"{name}.calls"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_pbs_verbs_pass_argument_lists_to_qsub_qstat_qdel(tmp_path):
    bin_dir = tmp_path / "bin"
    aurora_id = "123.aurora-pbs-0001.hostmgmt.cm.aurora.alcf.anl.gov"
    history = (FIXTURES / "pbs" / "live_qstat_f_F_dsv_end_states.txt").read_text()
    commands = {
        "submit": str(replaying_command(bin_dir, "qsub", stdout=aurora_id + "\n")),
        "query": str(replaying_command(bin_dir, "qstat", stdout=history)),
        "cancel": str(replaying_command(bin_dir, "qdel")),
    }
    pbs = scheduler_for("pbs", commands)
    job_dir = tmp_path / "job dir with 'quotes' and $(spaces)"
    job_dir.mkdir()
    script = job_dir / "job.sh"
    script.write_text("#!/bin/bash\n")
    native = pbs.submit(Submission(script=script, workdir=str(tmp_path), job_dir=job_dir,
                                   log_path=job_dir / "job.log", walltime=60))
    assert native == aurora_id
    assert calls(bin_dir, "qsub") == [[str(script)]]

    recorded = history.split("|")[0].removeprefix("Job Id: ")
    states = pbs.query([JobRef(recorded, job_dir), JobRef("999.aurora-pbs-0001", job_dir)])
    assert calls(bin_dir, "qstat") == [["-f", "-F", "dsv", "-x", recorded, "999.aurora-pbs-0001"]]
    assert states[recorded].state.terminal
    assert states["999.aurora-pbs-0001"].state is JobState.UNKNOWN

    pbs.cancel(JobRef(native, job_dir))
    assert calls(bin_dir, "qdel") == [[native]]


def test_qsubs_recorded_refusals_exit_2_with_its_words_and_leave_nothing(cli, isolated, tmp_path):
    """What the live test server's qsub answered to requests it refuses (recorded by
    fixtures/pbs/record_live.sh), as the profile's qsub: submit exits 2 with qsub's own words and
    records nothing. (test_pbs_server has the server refuse one itself.)"""
    for refusal in json.loads((FIXTURES / "pbs" / "live_qsub_refusals.json").read_text()):
        bin_dir = tmp_path / str(refusal["exit_code"])
        qsub = replaying_command(bin_dir, "qsub", stderr=refusal["stderr"] + "\n",
                                 code=refusal["exit_code"])
        write_machine(isolated, "pbs-replayed", "extends: pbs-local\nname: pbs-replayed\n"
                      f"scheduler: {{commands: {{submit: {qsub}}}}}\n")
        result = cli("submit", "pbs-replayed", "dist_check")
        assert result.code == 2, result.err
        assert result.err.strip() == f"mmm-orch: error: {qsub}: {refusal['stderr']}"
        assert len(calls(bin_dir, "qsub")) == 1  # permanent: not retried
        assert_nothing_recorded()


def test_pbs_query_reads_other_jobs_through_exit_153_and_35():
    for name, code in (("qstat_err_unknown_job_rc153_gadi.json", 153),
                       ("qstat_err_job_finished_rc35_polaris.json", 35)):
        record = json.loads((FIXTURES / "pbs" / name).read_text())
        assert record["exit_code"] == code
        stdout = record["stdout"].replace("xxx", "1")  # the recording elided its timestamp
        states = statuses_for(["5.server"], code, stdout, record["stderr"])
        assert states["5.server"].state is JobState.UNKNOWN
    with pytest.raises(SchedulerError, match="qstat: "):
        statuses_for(["5.server"], 1, "", "qstat: Bad UID for job execution")


def test_pbs_short_and_long_ids_are_the_same_job():
    full = next(iter(json.loads((FIXTURES / "pbs" / "qstat_fx_F_json_aurora_finished_exit_status.json")
                                .read_text())["Jobs"]))
    text = f"Job Id: {full}|job_state=F|substate=92|Exit_status=0\n"
    short = full.split(".")[0] + "." + full.split(".")[1]
    states = statuses_for([short], 0, text, "")
    assert states[short].state.terminal and states[short].native_id == full


def test_transient_errors_are_retried_then_succeed(tmp_path):
    counter = tmp_path / "n"
    flaky = tmp_path / "sbatch"
    flaky.write_text(
        "#!/bin/bash\nn=$(( $(cat %s 2>/dev/null || echo 0) + 1 ))\necho $n > %s\n"
        "if [ $n -lt 3 ]; then\n"
        "  echo 'sbatch: error: Batch job submission failed: Socket timed out on send/recv operation' >&2\n"
        "  exit 1\nfi\necho '77;mmmtest'\n" % (counter, counter))
    flaky.chmod(0o755)
    result = run_command(LocalRunner(), [str(flaky), "--parsable", "x"],
                         slurm_parse.TRANSIENT_ERRORS, FAST)
    assert result.returncode == 0 and slurm_parse.parse_sbatch(result.stdout) == "77"
    assert counter.read_text().strip() == "3"


def test_permanent_errors_fail_at_once_with_the_schedulers_words(tmp_path):
    record = json.loads((FIXTURES / "slurm" / "sbatch_err_invalid_partition.json").read_text())
    sbatch = replaying_command(tmp_path, "sbatch", stderr=record["stderr"], code=record["exit_code"])
    slurm = scheduler_for("slurm", {"submit": str(sbatch)})
    with pytest.raises(SchedulerError) as err:
        slurm.submit(Submission(script=tmp_path / "job.sh", workdir=str(tmp_path),
                                job_dir=tmp_path, log_path=tmp_path / "log", walltime=60))
    # "At once" is one call: a retry would show as a second one (wall time on a loaded
    # 2-core machine says nothing here).
    assert len(calls(tmp_path, "sbatch")) == 1
    assert "invalid partition specified: abcd" in str(err.value)
    assert err.value.exit_code == 2


@pytest.mark.slow
def test_a_scheduler_that_never_answers_is_bounded(tmp_path):
    slow = tmp_path / "squeue"
    slow.write_text("#!/bin/bash\nsleep 30\n")
    slow.chmod(0o755)
    budget = Retry(attempts=3, first_delay=0.1, max_delay=0.1, deadline=3, timeout=1)
    start = time.monotonic()
    with pytest.raises(SchedulerUnavailable, match="no answer within 1s"):
        run_command(LocalRunner(), [str(slow)], slurm_parse.TRANSIENT_ERRORS, budget)
    # Three unbounded attempts would take 90 s; the deadline keeps it near 3.
    assert time.monotonic() - start < 20


@pytest.mark.slow
@pytest.mark.parametrize("script", [
    "exec >&- 2>&-; sleep 30",  # closes its pipes, then lives on: the exit is what is waited for
    "sleep 30 & echo started",  # exits, but a child it left holds the pipes open
], ids=["closed-pipes", "child-holds-pipes"])
def test_a_local_command_is_bounded_however_it_hangs(script):
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as timed_out:
        LocalRunner().run(["bash", "-c", script], timeout=1)
    assert time.monotonic() - start < 10
    assert (timed_out.value.cmd, timed_out.value.timeout) == (["bash", "-c", script], 1)


@pytest.mark.slow
def test_a_local_command_given_up_on_goes_with_everything_it_started(tmp_path):
    """A tool that hangs (a balance tool, a login node's wrapper) is ended with its children:
    nothing it started runs on after the timeout."""
    pids = tmp_path / "pids"
    script = f"sleep 60 & echo $! > {pids}; wait"
    with pytest.raises(subprocess.TimeoutExpired):
        LocalRunner().run(["bash", "-c", script], timeout=1)
    child = int(pids.read_text())
    deadline = time.monotonic() + 10
    while _alive(child):
        assert time.monotonic() < deadline, f"{child} still runs after the command was given up"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")  # a killed process not yet reaped by init is no longer running


def test_a_local_command_that_never_stops_writing_is_bounded(monkeypatch):
    reads = 0

    class SlowReads:  # a byte every 10 ms: the pipe cat fills is never empty, always ready
        def __getattr__(self, name):
            return getattr(os, name)

        @staticmethod
        def read(fd: int, size: int) -> bytes:
            nonlocal reads
            reads += 1
            assert reads < 200, "still reading 1.5 s after the deadline"
            time.sleep(0.01)
            return os.read(fd, 1)

    monkeypatch.setattr(transport, "os", SlowReads())
    with pytest.raises(subprocess.TimeoutExpired):
        LocalRunner().run(["cat", "/dev/zero"], timeout=0.5)


def test_a_local_command_is_read_whole_as_text(tmp_path):
    # 2 MB on each pipe (more than a pipe holds, so both are read as they fill), a line ending
    # in CR LF, a bare CR and a byte that is not UTF-8: read as text=True would.
    script = ("head -c 2000000 /dev/zero | tr '\\0' o; printf 'a\\r\\nb\\rc\\377\\n'; "
              "head -c 2000000 /dev/zero | tr '\\0' e >&2; exit 3")
    result = LocalRunner().run(["bash", "-c", script], timeout=60)
    assert result.returncode == 3
    assert result.stdout == "o" * 2_000_000 + "a\nb\nc\ufffd\n"
    assert result.stderr == "e" * 2_000_000


def test_recorded_submit_loop_socket_timeouts_are_transient():
    text = (FIXTURES / "slurm" / "sbatch_submit_loop_socket_timeout_interleaved.txt").read_text()
    errors = [line for line in text.splitlines() if line.startswith("sbatch: error")]
    assert errors and all(slurm_parse.TRANSIENT_ERRORS.search(line) for line in errors)
    for name in ("sbatch_err_invalid_partition.json", "sbatch_err_qos_max_submit_limit.json",
                 "sbatch_err_node_config_unavailable.json"):
        stderr = json.loads((FIXTURES / "slurm" / name).read_text())["stderr"]
        assert not slurm_parse.TRANSIENT_ERRORS.search(stderr), name


def test_squeue_fixed_format_recorded_on_the_test_cluster():
    text = (FIXTURES / "slurm" / "squeue_format_A_T_S_r_22.05_slurm_local.txt").read_text()
    states = slurm_parse.parse_squeue_format(text)
    assert {k: (v.state, v.reason, v.started_at) for k, v in states.items()} == {
        "2275": (JobState.RUNNING, "", 1795345932.0),
        "2276": (JobState.PENDING, "Resources", None),  # %S of a pending job is a forecast
        "2277": (JobState.PENDING, "Priority", None)}


def test_sacct_recorded_on_the_test_cluster_failed_and_cancelled():
    text = (FIXTURES / "slurm" / "sacct_n_P2_22.05_slurm_local_failed_cancelled.txt").read_text()
    states = slurm_parse.parse_sacct_parsable(text, slurm_parse.SACCT_FIELDS)
    assert (states["2278"].state, states["2278"].exit_code) == (JobState.FAILED, 3)
    assert (states["2279"].state, states["2279"].exit_code) == (JobState.COMPLETED, 0)
    assert states["2280"].state is JobState.CANCELLED
    assert re.match(r"step 2280\.batch", states["2280"].reason)
    assert (states["2280"].started_at, states["2280"].ended_at) == (1795345934.0, 1795345940.0)


def test_every_kind_names_parts_that_exist():
    """A kind's parts are names ("module:attribute") imported only when used: each packaged kind's
    resolve, to a Scheduler class and functions."""
    from mmm_orch.schedulers import kinds

    for kind in kinds().values():
        assert isinstance(kind.part(kind.scheduler), type), kind.name
        for where in (kind.allocation, kind.drift):
            assert not where or callable(kind.part(where)), (kind.name, where)
    assert {name for name, kind in kinds().items() if kind.drift} == {"pbs", "slurm"}
