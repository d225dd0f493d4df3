"""Startup timing: markers in logs (ours and the study's), `timeline` and `startup`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmm_orch.progress.startup import parse_markers
from helpers.jobs import wait_state

FIXTURES = Path(__file__).parent / "fixtures" / "startup"


def test_the_studys_polaris_logs(cli):
    result = cli("startup", "--json", "--log", *sorted(str(p) for p in FIXTURES.glob("*.log")))
    assert result.code == 0, result.err
    report = json.loads(result.out)
    seconds = {row["log"][-21:-4]: row["startup_s"] for row in report["runs"]}
    assert seconds == {"2023-11-02-183323": 50.122, "2023-11-02-184240": None,
                       "2023-11-02-184259": 24.385, "2023-11-02-184407": 25.804,
                       "2023-11-02-192739": None}
    [group] = report["groups"]
    assert (group["nodes"], group["ranks"], group["runs"]) == (4, 16, 3)
    assert (group["median_s"], group["worst_s"]) == (25.804, 50.122)
    text = cli("startup", "--log", *sorted(str(p) for p in FIXTURES.glob("*.log"))).out
    assert "median 25.8s, worst 50.1s" in text and "2 run(s) without a first step" in text


def test_clock_times_are_subtracted_as_times_not_as_numbers(tmp_path):
    # The study's Perlmutter table row 2023-10-05 191101 -> 191215 lists "114": the HHMMSS
    # numbers subtracted. The two stamps are 74 s apart.
    markers = parse_markers("Job started at: 2023-10-05-191101 on nid008217\n"
                            "[2023-10-05 19:12:15,000] [INFO] [Rank 0] step=0, skipped=0\n")
    assert markers.startup_s == 74.0 and markers.host == "nid008217"
    # Across midnight too.
    late = parse_markers("Job started at: 2023-10-15-235950\n[2023-10-16 00:00:40,500] step=0,\n")
    assert late.startup_s == 50.5


def test_our_markers_win_over_the_study_style_lines():
    text = ("Job started at: 2026-11-22-010000 on n1\n"
            "[mmm-orch] job_start=1000.0 host=n1 job=7\n"
            "[mmm-orch] launch_start=1001.5 ranks=8 nodes=2\n"
            "[2026-11-22 01:00:09,000] unrelated step=3 line\n"
            "[mmm-orch] first_step=1042.25 step=1 at=2026-11-22 01:00:42\n"
            "[mmm-orch] launch_end=1100 exit_code=0\n")
    m = parse_markers(text)
    assert (m.job_start, m.launch_start, m.first_step, m.launch_end) == (1000.0, 1001.5, 1042.25, 1100.0)
    assert m.launch_exit == 0
    assert (m.nodes, m.ranks, m.host, m.startup_s) == (2, 8, "n1", 42.25)


@pytest.mark.slow
def test_timeline_and_startup_of_a_real_local_run(cli, isolated):
    submitted = cli("submit", "local", "fsdp", "--set", "tiny=true", "--set", "epochs=1",
                    "--set", "train_samples=512")
    assert submitted.code == 0, submitted.err
    assert wait_state(cli, 1)["state"] == "completed"
    result = cli("timeline", "1", "--json")
    assert result.code == 0, result.err
    timeline = json.loads(result.out)
    names = [e["event"] for e in timeline["events"]]
    assert names == ["submitted", "job start", "launch start", "first step", "launch end", "ended"]
    times = [e["at"] for e in timeline["events"]]
    assert all(later >= earlier - 0.01 for earlier, later in zip(times, times[1:])), times
    assert 0 < timeline["startup_s"] < 120
    report = json.loads(cli("startup", "--workload", "fsdp", "--json").out)
    assert report["runs"][0]["startup_s"] == timeline["startup_s"]
    assert report["groups"][0]["runs"] == 1 and report["groups"][0]["machine"] == "local"
    assert "startup (job start to first step)" in cli("timeline", "1").out
    assert json.loads(cli("startup", "--workload", "vit", "--json").out)["runs"] == []
