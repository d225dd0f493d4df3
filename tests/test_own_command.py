"""Your own code in batch: `mmm-orch submit MACHINE -- COMMAND ARGS...` runs the command where a
trainer would run, under the machine's launcher and environment, recorded like any job. It
prints no step=N lines, so the watchdog judges progress by its output. On the live schedulers a
command runs on two nodes in test_facility_profilers (under a profiler), and in test_launch and
test_api."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from helpers.jobs import TERMINAL, assert_nothing_recorded, wait_state
from helpers.profiles import write_spec

# One write of one whole line: ranks share the log, and under torchrun Python's stdout is
# unbuffered, so print('rank', r) would be three writes that another rank's can split.
RANKS = ("import os, socket; os.write(1, ('rank %s %s\\n' % (os.environ['RANK'], "
         "socket.gethostname())).encode())")


def test_render_shows_the_command_quoted_under_the_launcher(cli):
    tricky = "print('$(touch CANARY) `id`; it''s')"
    result = cli("render", "local", "--", "python3", "-c", tricky)
    assert result.code == 0, result.err
    launch = next(line for line in result.out.splitlines() if "-m mmm_orch.injob.watchdog" in line)
    inner = shlex.split(launch)[-1]  # the launch line the watchdog runs
    assert shlex.split(inner)[-4:] == ["--no-python", "python3", "-c", tricky]
    assert "--progress output" in launch
    assert "it prints no output for 1800 s" in result.out
    assert "mmm_orch.trainers" not in result.out
    assert not Path("CANARY").exists()


@pytest.mark.slow
def test_a_command_that_exits_3_is_recorded_failed_with_3(cli, isolated):
    code = "import sys; print('working', flush=True); sys.exit(3)"
    submitted = cli("submit", "local", "--", sys.executable, "-c", code)
    assert submitted.code == 0, submitted.err
    row = wait_state(cli, 1, TERMINAL, timeout=120)
    assert (row["state"], row["exit_code"]) == ("failed", 3), cli("logs", "1").out
    assert row["workload"] == "command"
    record = json.loads(cli("show", "1", "--json").out)
    assert record["plan"]["launch"]["command"][-3:] == [sys.executable, "-c", code]
    assert "working" in cli("logs", "1").out


@pytest.mark.slow
def test_a_command_with_everything_it_needs_completes_on_every_rank(cli, isolated):
    assert cli("submit", "local", "--", sys.executable, "-c", RANKS).code == 0
    row = wait_state(cli, 1, TERMINAL, timeout=120)
    log = cli("logs", "1").out
    assert (row["state"], row["exit_code"]) == ("completed", 0), log
    assert set(re.findall(r"\brank (\d) ", log)) == {"0", "1"}, log
    # It reports no steps: timeline and report say there is nothing of that kind to show.
    timeline = cli("timeline", "1").out
    assert "no first step: its program reported no steps" in timeline, timeline
    report = cli("report", "1")
    assert report.code == 0 and "job 1: its program reported no steps" in report.err, report.err


@pytest.mark.slow
def test_a_command_that_goes_silent_is_ended_as_hung(cli, isolated):
    """A workload of one's own without a trainer: the user's timeouts, progress by output."""
    write_spec(isolated, "quiet", """
name: quiet
description: prints once, then nothing
watchdog: {progress: output, first_step_timeout: 20, step_timeout: 4}
""")
    code = "import time; print('started', flush=True); time.sleep(600)"
    assert cli("submit", "local", "quiet", "--", sys.executable, "-c", code).code == 0
    row = wait_state(cli, 1, TERMINAL, timeout=120)
    assert (row["state"], row["exit_code"]) == ("hung", 124), cli("logs", "1").out
    assert "no output in 4s" in row["reason"]


@pytest.mark.slow
def test_a_progress_pattern_ignores_other_output(cli, isolated):
    write_spec(isolated, "ticks", """
name: ticks
watchdog: {progress: "^tick", first_step_timeout: 20, step_timeout: 4}
""")
    code = ("import itertools, time; [print('tick', i, flush=True) or time.sleep(1) for i in "
            "range(3)]; [print('chatter', flush=True) or time.sleep(0.5) for _ in itertools.count()]")
    assert cli("submit", "local", "ticks", "--", sys.executable, "-c", code).code == 0
    row = wait_state(cli, 1, TERMINAL, timeout=120)
    assert (row["state"], row["exit_code"]) == ("hung", 124), cli("logs", "1").out
    assert "no line matching '^tick' in 4s" in row["reason"]


@pytest.mark.parametrize("argv,fragment", [
    (["submit", "local", "--"], "command after -- is missing"),
    (["submit", "local", "fsdp", "--", "python3", "x.py"], "runs its trainer"),
    (["submit", "local", "command"], "give it after --"),
    (["submit", "local", "--", "python3", "-c", "a\nb"], "command word 3"),
    (["status", "--", "ls"], "nothing may follow --"),
])
def test_bad_commands_are_refused_and_nothing_is_recorded(cli, argv, fragment):
    result = cli(*argv)
    assert result.code == 2 and fragment in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert_nothing_recorded()


def test_a_workload_progress_that_is_no_pattern_is_refused(cli, isolated):
    write_spec(isolated, "broken", "name: broken\nwatchdog: {progress: '(unclosed'}\n")
    result = cli("render", "local", "broken", "--", "true")
    assert result.code == 2 and "progress" in result.err and "(unclosed" in result.err
