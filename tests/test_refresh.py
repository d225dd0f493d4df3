"""How mmm-orch reads the end of a job the scheduler reports as ended: the job's own log has the
last word where the scheduler's answer is ambiguous (a success that was a cancel); and where a
job with spare nodes stands, from the failover.json it writes, damaged or not."""

from __future__ import annotations

import types

import pytest

from mmm_orch.hosts import host_for
from mmm_orch.progress.refresh import _as_the_job_ended, _failover
from mmm_orch.schedulers.states import JobState, JobStatus

LAUNCHED = "[mmm-orch] launch_start=1.0 ranks=2 nodes=1\n"
SUCCEEDED = LAUNCHED + "[mmm-orch] launch_end=9.5 exit_code=0\n"


@pytest.mark.parametrize("log, cancel_sent, state", [
    ("", True, JobState.CANCELLED),  # killed after a PBS server restart: exit 0, empty log
    (LAUNCHED, True, JobState.CANCELLED),
    (SUCCEEDED, True, JobState.COMPLETED),  # it finished before the cancel reached it
    ("", False, JobState.COMPLETED),  # nobody cancelled it: the scheduler's word stands
    ("some output of a template without markers\n", False, JobState.COMPLETED),
    # A raw qdel racing the job's end (PBS substate 92, Exit_status 0; seen once in ~40 runs of
    # test_raw_qdel_while_running_ends_cancelled): the launch began and the script never said
    # how it ended, which it always does when it exits by itself.
    (LAUNCHED + "step=3\n", False, JobState.CANCELLED),
    (SUCCEEDED, False, JobState.COMPLETED),
    (LAUNCHED + "[mmm-orch] job script: stopped by SIGTERM: exit 143\n", False, JobState.CANCELLED),
])
def test_a_success_after_a_cancel_is_read_from_the_log(tmp_path, log, cancel_sent, state):
    (tmp_path / "job.log").write_text(log)
    # (no outcome file in the job's directory: the log is read)
    record = types.SimpleNamespace(log_path=str(tmp_path / "job.log"), job_dir=str(tmp_path))
    ended = JobStatus("1.vm", JobState.COMPLETED, "F", exit_code=0)
    read = _as_the_job_ended(ended, record, host_for(""), cancel_sent)
    assert read.state is state
    assert (read.exit_code is None) == (state is JobState.CANCELLED)


GOOD = ('{"attempt": 2, "attempts": 3, "active": ["n1"], "spares": [], "retired": [{"node": "n2", '
        '"blind": false, "evidence": "n2: shepherd died"}]}')


@pytest.mark.parametrize("text", [
    GOOD[:40],  # truncated
    "[1, 2]",  # another shape
    '{"attempt": 2}',  # keys missing
    '{"attempt": 1, "attempts": 2, "active": [], "spares": [], "retired": [{"node": "n2"}]}',
    "\u0000\xff",
])
def test_a_damaged_failover_file_is_a_note_on_the_job_never_a_crash(tmp_path, text):
    (tmp_path / "failover.json").write_text(text)
    record = types.SimpleNamespace(job_dir=str(tmp_path))
    running = JobStatus("1.vm", JobState.RUNNING, "R", reason="")
    read, lost = _failover(running, record, host_for(""))
    assert read.state is JobState.RUNNING and lost == []
    assert read.reason == ("failover.json is not as the job writes it (truncated or changed): "
                           "its attempts are not shown")


def test_where_a_job_with_spares_stands_is_read_from_its_failover_file(tmp_path):
    (tmp_path / "failover.json").write_text(GOOD)
    record = types.SimpleNamespace(job_dir=str(tmp_path))
    read, lost = _failover(JobStatus("1.vm", JobState.RUNNING, "R"), record, host_for(""))
    assert read.reason.startswith("attempt 2/3; n2 retired (n2: shepherd died); active n1")
    assert [entry["node"] for entry in lost] == ["n2"]
    (tmp_path / "failover.json").unlink()  # not written yet: nothing to say
    assert _failover(JobStatus("1.vm", JobState.RUNNING, "R"), record, host_for("")) == (
        JobStatus("1.vm", JobState.RUNNING, "R"), [])
