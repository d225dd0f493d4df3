"""Scheduler output parsers on real recorded outputs (tests/fixtures, provenance in its README),
and the state machine."""

from __future__ import annotations

import json
import re

import pytest

from conftest import REPO
from mmm_orch.schedulers import pbs_parse, slurm_parse
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


def test_qstat_aurora_history_exit_status():
    jobs = pbs_parse.parse_qstat_json(text("pbs/qstat_fx_F_json_aurora_finished_exit_status.json"))
    by_number = {k.split(".")[0]: (v.state, v.exit_code) for k, v in jobs.items()}
    assert by_number == {"6617175": (S.TIMEOUT, None), "6617182": (S.TIMEOUT, None),
                         "6631289": (S.COMPLETED, 0), "4905472": (S.PENDING, None)}
    assert jobs["4905472.aurora-pbs-0001.hostmgmt.cm.aurora.alcf.anl.gov"].reason.startswith("Job held by")


def test_qstat_polaris_queued_held_running_with_comments():
    jobs = pbs_parse.parse_qstat_json(text("pbs/qstat_f_F_json_polaris_Q_H_R_excerpt.json"))
    states = {k.split(".")[0]: v.state for k, v in jobs.items()}
    assert states == {"359322": S.PENDING, "412020": S.PENDING, "1147579": S.RUNNING}
    assert "too many failed attempts" in jobs["412020.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov"].reason


def test_qstat_openpbs_leading_newline_and_history():
    running = pbs_parse.parse_qstat_json(text("pbs/qstat_f_F_json_openpbs23_running_leading_newline.json"))
    assert [j.state for j in running.values()] == [S.RUNNING]
    mixed = pbs_parse.parse_qstat_json(text("pbs/qstat_fx_F_json_openpbs23_finished_and_running.json"))
    assert {k: v.state for k, v in mixed.items()} == {"1004.pbs": S.COMPLETED, "1005.pbs": S.COMPLETED,
                                                      "1006.pbs": S.RUNNING}


def test_qstat_error_records_have_no_jobs_and_known_codes():
    finished = record("pbs/qstat_err_job_finished_rc35_polaris.json")
    assert finished["exit_code"] == pbs_parse.QSTAT_JOB_FINISHED
    assert pbs_parse.parse_qstat_json(finished["stdout"]) == {}
    unknown = record("pbs/qstat_err_unknown_job_rc153_gadi.json")
    assert unknown["exit_code"] == pbs_parse.QSTAT_UNKNOWN_JOB
    assert not pbs_parse.TRANSIENT_ERRORS.search(unknown["stderr"])


def test_qstat_invalid_json_numbers_are_repaired():
    fragment = '{"Jobs": {"53.pbs": {"job_state": "Q", "Variable_List": {"foo":005,\n "FOO1":.123, "FOO2":123.}}}}'
    jobs = pbs_parse.parse_qstat_json(fragment)
    assert jobs["53.pbs"].state is S.PENDING


def test_qstat_start_and_end_times_are_read_as_utc():
    jobs = pbs_parse.parse_qstat_json(text("pbs/qstat_fx_F_json_openpbs23_finished_and_running.json"))
    done = [s for s in jobs.values() if s.state.terminal and s.ended_at]
    assert done, jobs
    assert all(s.started_at <= s.ended_at for s in done)
    assert pbs_parse.utc_time("Sat Dec  3 20:25:38 2022") == 1670099138.0
    assert pbs_parse.utc_time("") is None


def test_qstat_json_is_mended_for_every_recorded_breakage():
    # The recorded lines themselves (bare numbers, unescaped quotes) inside one job record.
    lines = [line.rstrip().rstrip(",") for line in text("pbs/qstat_json_invalid_fragments.txt").splitlines()
             if re.match(r'\s+"(foo|FOO\d|comment)":', line)]
    assert len(lines) == 8
    document = ('{\n"Jobs":{\n"7.pbs":{\n"job_state":"R",\n"Variable_List":{\n'
                + ",\n".join(lines) + ',\n"WINPATH":"C:\\scratch\\x"\n}}}}')
    job = pbs_parse.load_qstat_json(document)["Jobs"]["7.pbs"]["Variable_List"]
    assert (job["foo"], job["FOO1"], job["FOO2"], job["FOO3"], job["FOO4"], job["FOO5"],
            job["FOO6"]) == ("005", ".123", "123.", "00", "-00", "00.123", "-00.123")
    assert '"zaskly sdileny scratch" (Sep 04' in job["comment"]
    assert job["WINPATH"] == "C:\\scratch\\x"
    assert pbs_parse.parse_qstat_json(document)["7.pbs"].state is S.RUNNING


def test_qstat_plain_table_before_the_json_is_skipped():
    data = pbs_parse.load_qstat_json(text("pbs/qstat_u_fF_JSON_mixed_plaintext_bug_openpbs23.txt"))
    assert (data["pbs_version"], data["pbs_server"]) == ("23.06.06", "VMa")


def test_unreadable_qstat_json_is_a_scheduler_error_not_a_crash():
    from mmm_orch.schedulers.base import SchedulerError
    from mmm_orch.schedulers.pbs import statuses_for

    with pytest.raises(SchedulerError, match="qstat: qstat printed JSON that cannot be read"):
        statuses_for(["1.pbs"], 0, '{"Jobs": {"1.pbs": {"job_state": }}}', "")


def test_every_recorded_pbs_error_is_classified():
    """qsub rejections are permanent (no retry: the user must change the request); qstat's
    unknown-job and finished-job texts are not scheduler outages either."""
    for entry in record("pbs/pbs_error_messages_catalog.json"):
        assert not pbs_parse.TRANSIENT_ERRORS.search(entry["text"]), entry["text"]
    for message in ("qstat: cannot connect to host pbs01", "Communication failure.",
                    "qsub: Connection refused"):
        assert pbs_parse.TRANSIENT_ERRORS.search(message)


def test_pbs_signal_and_failure_exit_statuses():
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
