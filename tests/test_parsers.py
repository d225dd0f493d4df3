"""Scheduler output parsers on real recorded outputs (tests/fixtures, provenance in its README),
and the state machine."""

from __future__ import annotations

import json

import pytest
from helpers import REPO

from mmm_orch.schedulers.pbs import parse as pbs_parse
from mmm_orch.schedulers.slurm import parse as slurm_parse
from mmm_orch.schedulers.states import JobState, advance

FIX = REPO / "tests" / "fixtures"
S = JobState


def text(path: str) -> str:
    return (FIX / path).read_text()


def record(path: str) -> dict:
    return json.loads(text(path))


# ---- Slurm -------------------------------------------------------------------------------

@pytest.mark.parametrize("path,expected", [
    ("slurm/sbatch_parsable_stdout_cluster_suffix.txt", "75168975"),
    ("slurm/sbatch_stdout_submitted.txt", "24"),
    ("slurm/sbatch_stdout_on_cluster_suffix.txt", "3969755"),
    ("slurm/sbatch_stdout_site_wrapper_bare_jobid.txt", "15786755"),
])
def test_sbatch_ids(path, expected):
    assert slurm_parse.parse_sbatch(text(path)) == expected


def test_sbatch_without_an_id_is_an_error():
    with pytest.raises(ValueError, match="no job id"):
        slurm_parse.parse_sbatch(record("slurm/sbatch_err_invalid_partition.json")["stdout"])


def test_sbatch_errors_transient_or_permanent():
    loop = text("slurm/sbatch_submit_loop_socket_timeout_interleaved.txt")
    assert slurm_parse.TRANSIENT_ERRORS.search(loop.splitlines()[0])
    assert slurm_parse.TRANSIENT_ERRORS.search(record("slurm/sacct_err_db_connection_timed_out.json")["stderr"])
    for permanent in ["sbatch_err_invalid_partition.json", "sbatch_err_qos_max_submit_limit.json",
                      "sbatch_err_node_config_unavailable.json"]:
        assert not slurm_parse.TRANSIENT_ERRORS.search(record(f"slurm/{permanent}")["stderr"])


def test_sacct_parsable_without_header():
    jobs = slurm_parse.parse_sacct_parsable(
        text("slurm/sacct_n_P_jobidraw_state_exitcode_spider.txt"), ["JobIDRaw", "State", "ExitCode"])
    summary = {k: (v.state, v.exit_code, v.signal) for k, v in jobs.items()}
    assert summary == {
        "609663": (S.FAILED, None, 2), "754725": (S.TIMEOUT, 0, None), "765096": (S.FAILED, None, 9),
        "767925": (S.FAILED, 2, None), "785023": (S.FAILED, 127, None), "789456": (S.FAILED, 1, None),
        "789724": (S.RUNNING, None, None), "789868": (S.PENDING, None, None),
        "789869": (S.COMPLETED, 0, None),
    }
    assert jobs["765096"].reason == "step 765096.0: CANCELLED by 54386"


def test_sacct_a_job_cancelled_while_pending_never_started():
    """Recorded on the test cluster: a chain whose first link failed cancelled the two links
    waiting on it. Slurm gives them a Start, the time of the cancel, but no nodes."""
    jobs = slurm_parse.parse_sacct_parsable(
        text("slurm/sacct_n_P2_22.05_slurm_local_cancelled_while_pending.txt"),
        slurm_parse.SACCT_FIELDS)
    assert (jobs["5491"].state, jobs["5491"].started_at) == (S.FAILED, 1795608342)
    for waiting in ("5492", "5493"):
        assert (jobs[waiting].state, jobs[waiting].started_at, jobs[waiting].ended_at) == \
            (S.CANCELLED, None, 1795608344)


def test_sacct_parsable_frontier_oom_step_is_the_reason():
    jobs = slurm_parse.parse_sacct_parsable(text("slurm/sacct_P_header_frontier_failed_oom_step.txt"))
    job = jobs["4979526"]
    assert (job.state, job.exit_code) == (S.FAILED, 90)
    assert job.reason == "step 4979526.0: OUT_OF_MEMORY"


def test_squeue_json_21_08_strings():
    jobs = slurm_parse.parse_squeue_json(text("slurm/squeue_json_21.08.5_running.json"))
    assert jobs and all(j.state is S.RUNNING for j in jobs.values() if j.native_state == "RUNNING")
    assert jobs["26515966"].state is S.RUNNING


def test_squeue_json_24_11_lists_and_number_objects():
    jobs = slurm_parse.parse_squeue_json(
        text("slurm/squeue_json_equiv_slurmrestd_24.11_v0.0.42_multi_state.json"))
    summary = {k: (v.state, v.exit_code, v.signal, v.reason) for k, v in jobs.items()}
    assert summary["6360"] == (S.RUNNING, None, None, "")
    assert summary["6369"] == (S.PENDING, None, None, "Resources")
    assert summary["6358"] == (S.COMPLETED, 0, None, "")
    assert summary["6359"] == (S.FAILED, 1, None, "NonZeroExitCode")
    assert summary["6357"] == (S.TIMEOUT, None, 15, "TimeLimit")
    assert summary["6355"] == (S.CANCELLED, None, 15, "")


@pytest.mark.parametrize("path,job,state,exit_code", [
    ("slurm/sacct_json_21.08.8_cedar_requeued.json", "55978384", S.PENDING, None),
    # FAILED with exit_code SUCCESS/0: contradictory, so the exit code is unknown, not 0
    ("slurm/sacct_json_22.05.9_narval_failed.json", "20247445", S.FAILED, None),
    ("slurm/sacct_json_23.02.6_mila_running.json", "4", S.RUNNING, None),
])
def test_sacct_json_versions(path, job, state, exit_code):
    jobs = slurm_parse.parse_sacct_json(text(path))
    assert (jobs[job].state, jobs[job].exit_code) == (state, exit_code)


def test_failed_job_with_zero_exit_takes_the_derived_exit_code():
    jobs = slurm_parse.parse_sacct_parsable("7|FAILED|0:0|4:0\n", ["JobIDRaw", "State", "ExitCode", "DerivedExitCode"])
    assert jobs["7"].exit_code == 4


def test_scontrol_multiline_pending_held():
    jobs = slurm_parse.parse_scontrol_show_job(text("slurm/scontrol_show_job_mila_pending_held_reqnodenotavail.txt"))
    assert len(jobs) == 2
    assert all(j.state is S.PENDING for j in jobs.values())
    reasons = sorted(j.reason for j in jobs.values())
    assert reasons[0] == "JobHeldAdmin"
    assert reasons[1].startswith("ReqNodeNotAvail,_UnavailableNodes:node8")


def test_scontrol_one_line_formats():
    done = slurm_parse.parse_scontrol_show_job(record("slurm/scontrol_show_job_o_completed_qtoolkit.json")["stdout"])
    assert [(j.native_id, j.state, j.exit_code) for j in done.values()] == [("270", S.COMPLETED, 0)]
    running = slurm_parse.parse_scontrol_show_job(text("slurm/scontrol_show_job_o_running_epoch_times_alps.txt"))
    assert [(j.native_id, j.state) for j in running.values()] == [("1", S.RUNNING)]


def test_scontrol_unknown_job_gives_nothing():
    assert slurm_parse.parse_scontrol_show_job(record("slurm/scontrol_err_invalid_job_id.json")["stderr"]) == {}


# ---- PBS ---------------------------------------------------------------------------------

@pytest.mark.parametrize("path,expected", [
    ("pbs/qsub_stdout_openpbs23_short_server.txt", "1.pbs"),
    ("pbs/qsub_stdout_palmetto_batch.txt", "8738.pbs02"),
])
def test_qsub_ids(path, expected):
    assert pbs_parse.parse_qsub(text(path)) == expected


def test_qsub_aurora_style_id_and_same_job():
    job = pbs_parse.parse_qsub("6617175.aurora-pbs-0001.hostmgmt.cm.aurora.alcf.anl.gov\n")
    assert job.startswith("6617175.")
    assert pbs_parse.same_job(job, "6617175.aurora-pbs-0001")
    assert not pbs_parse.same_job(job, "6617176.aurora-pbs-0001")


def site_jobs(path: str) -> dict:
    """The job records of a qstat -f -F json capture from a site (pbs_state reads the same
    attributes from JSON and from DSV)."""
    return json.loads(text(path))["Jobs"]


def test_qstat_aurora_history_exit_status():
    jobs = pbs_parse.statuses(site_jobs("pbs/qstat_fx_F_json_aurora_finished_exit_status.json"))
    by_number = {k.split(".")[0]: (v.state, v.exit_code) for k, v in jobs.items()}
    assert by_number == {"6617175": (S.TIMEOUT, None), "6617182": (S.TIMEOUT, None),
                         "6631289": (S.COMPLETED, 0), "4905472": (S.PENDING, None)}
    assert jobs["4905472.aurora-pbs-0001.hostmgmt.cm.aurora.alcf.anl.gov"].reason.startswith("Job held by")


def test_qstat_polaris_queued_held_running_with_comments():
    jobs = pbs_parse.statuses(site_jobs("pbs/qstat_f_F_json_polaris_Q_H_R_excerpt.json"))
    states = {k.split(".")[0]: v.state for k, v in jobs.items()}
    assert states == {"359322": S.PENDING, "412020": S.PENDING, "1147579": S.RUNNING}
    assert "too many failed attempts" in jobs["412020.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov"].reason


def test_qstat_start_and_end_times_are_read_as_utc():
    jobs = pbs_parse.statuses(site_jobs("pbs/qstat_fx_F_json_openpbs23_finished_and_running.json"))
    done = [s for s in jobs.values() if s.state.terminal and s.ended_at]
    assert done, jobs
    assert all(s.started_at <= s.ended_at for s in done)
    assert pbs_parse.utc_time("Sat Dec  3 20:25:38 2022") == 1670099138.0
    assert pbs_parse.utc_time("") is None


def live_dsv() -> dict:
    """What the live OpenPBS server reported for each way a job ends (record_live.sh), by name."""
    jobs = pbs_parse.load_qstat_dsv(text("pbs/live_qstat_f_F_dsv_end_states.txt"))
    return {job["Job_Name"]: (job_id, job) for job_id, job in jobs.items()}


@pytest.mark.parametrize("name,state,code", [
    ("exit0", S.COMPLETED, 0),
    ("exit3", S.FAILED, 3),
    ("walltime", S.TIMEOUT, None),
    # Deleted while running: F, substate 91, Exit_status 0, even when the script traps SIGTERM
    # and exits 75. Read from Exit_status alone this was "completed".
    ("deleted_running", S.CANCELLED, None),
    ("deleted_trapping", S.CANCELLED, None),
    ("deleted_queued", S.CANCELLED, None),
    ("held", S.PENDING, None),
    ("never", S.PENDING, None),
])
def test_every_way_a_job_ends_on_the_live_server(name, state, code):
    job_id, job = live_dsv()[name]
    status = pbs_parse.statuses({job_id: job})[job_id]
    assert (status.state, status.exit_code) == (state, code), job
    if name == "never":
        assert status.reason.startswith("Can Never Run: ")
    if state.terminal and name != "deleted_queued":
        assert status.started_at and status.ended_at >= status.started_at


def test_several_ids_as_json_hold_only_the_first_job_on_this_server():
    """Why queries read DSV: the same eight ids asked for as JSON (openpbs#2672)."""
    assert len(site_jobs("pbs/live_qstat_f_F_json_several_ids.json")) == 1
    assert len(live_dsv()) == 8


def test_dsv_escapes_the_delimiter_and_the_escape_character():
    line = 'Job Id: 9.vm|comment=a \\| b \\\\ c|Variable_List=A=1,B=x\\,y,MMM_ORCH_TAG=t1|job_state=Q\n'
    job = pbs_parse.load_qstat_dsv(line)["9.vm"]
    assert job["comment"] == "a | b \\ c" and job["job_state"] == "Q"
    assert pbs_parse.ids_with_tag({"9.vm": job}, "t1") == ["9.vm"]
    assert pbs_parse.ids_with_tag({"9.vm": job}, "t2") == []


def test_qstat_error_records_have_known_codes():
    finished = record("pbs/qstat_err_job_finished_rc35_polaris.json")
    assert finished["exit_code"] == pbs_parse.QSTAT_JOB_FINISHED
    assert pbs_parse.parse_qstat_dsv(finished["stdout"]) == {}
    unknown = record("pbs/qstat_err_unknown_job_rc153_gadi.json")
    assert unknown["exit_code"] == pbs_parse.QSTAT_UNKNOWN_JOB
    assert not pbs_parse.TRANSIENT_ERRORS.search(unknown["stderr"])


def test_live_qsub_refusals_are_permanent():
    refusals = json.loads(text("pbs/live_qsub_refusals.json"))
    assert {r["exit_code"] for r in refusals} == {170, 188, 187, 166}
    for refusal in refusals:
        assert not pbs_parse.TRANSIENT_ERRORS.search(refusal["stderr"]), refusal
        assert refusal["exit_code"] not in pbs_parse.TRANSIENT_EXIT_CODES


def test_every_recorded_pbs_error_is_classified():
    """qsub rejections are permanent (no retry: the user must change the request); qstat's
    unknown-job and finished-job texts are not scheduler outages either."""
    for entry in record("pbs/pbs_error_messages_catalog.json"):
        assert not pbs_parse.TRANSIENT_ERRORS.search(entry["text"]), entry["text"]
    for message in ("qstat: cannot connect to host pbs01", "Communication failure.",
                    "qsub: Connection refused"):
        assert pbs_parse.TRANSIENT_ERRORS.search(message)


def test_pbs_signal_and_failure_exit_statuses():
    # Older servers (recorded elsewhere) write a qdel as 256 + SIGTERM and no substate.
    assert pbs_parse.pbs_state({"job_state": "F", "Exit_status": 271})[0] is S.CANCELLED
    assert pbs_parse.pbs_state({"job_state": "F", "Exit_status": 265}) == (S.FAILED, None, 9)
    assert pbs_parse.pbs_state({"job_state": "F", "Exit_status": 3}) == (S.FAILED, 3, None)
    assert pbs_parse.pbs_state({"job_state": "F"})[0] is S.CANCELLED


# ---- state machine -----------------------------------------------------------------------

def test_states_never_move_backwards():
    assert advance(S.RUNNING, S.PENDING) is S.RUNNING
    assert advance(S.PENDING, S.RUNNING) is S.RUNNING
    assert advance(S.COMPLETED, S.RUNNING) is S.COMPLETED
    assert advance(S.FAILED, S.COMPLETED) is S.FAILED
    assert advance(S.RUNNING, S.UNKNOWN) is S.RUNNING
    assert advance(S.UNKNOWN, S.PENDING) is S.PENDING
    assert advance(S.PENDING, S.TIMEOUT) is S.TIMEOUT
