"""`mmm-orch machines check`'s software half on the test hosts' real Lmod (Debian's lmod; the module
trees of tests/fixtures/modules: an old programming environment, pe-2025, and the new one that
replaced it, pe-2026), the last check read before the queue, and a job that stops at its first
failed setup line. The check runs no scheduler job: one clean shell per stack, here or over SSH.

No module fakes Python or torch: pe-2025's frameworks module puts this checkout's .venv first on
PATH (torch 2.13.0), pe-2026's puts Debian's /usr/bin first (a python3 without torch). The
profiles here say `python: python3`, so the check reads the interpreter the stack gives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from helpers.jobs import assert_nothing_recorded, wait_state
from helpers.profiles import write_machine
from helpers.ssh import ssh_config
from mmm_orch.injob.diagnose import setup_failure
from mmm_orch.planning import software

TREES = Path("/opt/mmm-orch-test/modules")
LMOD_INIT = "source /usr/share/lmod/lmod/init/bash"
FIXTURES = Path(__file__).parent / "fixtures"


def python_version(python: str) -> str:
    return subprocess.run(
        [python, "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def stack(name: str, tree: Path, load: str, default: bool = False, **facts) -> dict:
    return {
        "name": name,
        "default": default,
        "date": "2026-11-28",
        "source": "the test trees",
        "module_tree": str(tree),
        "setup": [LMOD_INIT, f"module load {load}"],
        **facts,
    }


def upgraded_profile(isolated: Path, current: Path, retired: Path) -> None:
    """A user's profile written for the old tree, reached through links an upgrade repoints:
    `current` (the facility's default tree) and `retired` (one it later removes)."""
    stacks = [
        stack(
            "frameworks",
            current,
            "frameworks",
            default=True,
            gives={"torch": "2.13", "python": python_version(sys.executable)},
            sets={"MMM_TEST_CCL_SYNC": "1", "MMM_TEST_KVS_MODE": "mpi"},
        ),
        stack("frameworks-2025.3", current, "frameworks/2025.3"),
        stack("conda-2025-09", current, "conda/2025-09", sets={"MMM_TEST_CONDA": "2025-09"}),
        stack("old-pe", retired, "frameworks/2025.3"),
    ]
    write_machine(
        isolated,
        "upgraded",
        json.dumps(
            {"extends": "slurm-local", "name": "upgraded", "python": "python3", "stacks": stacks}
        ),
    )


def repoint(link: Path, tree: str | None) -> None:
    link.unlink(missing_ok=True)
    if tree:
        link.symlink_to(TREES / tree)


def findings(result) -> dict[str, list[str]]:
    return {name: got["findings"] for name, got in json.loads(result.out)["stacks"].items()}


# --- live: the trees on the test hosts ---------------------------------------------------------


def test_the_test_profiles_load_clean_on_the_tree_they_were_written_for(
    cli, isolated, slurm_cluster, pbs_server
):
    for machine in ("slurm-local", "pbs-local"):
        result = cli("machines", "check", machine)
        assert result.code == 0, result.out + result.err
        assert (
            f"{machine}: stack frameworks-2025.3 loads as the profile says "
            "(MMM_TEST_CCL_SYNC=1, MMM_TEST_KVS_MODE=mpi, python "
        ) in result.out
        kept = software.last_check(machine, "frameworks-2025.3")
        assert kept is not None and kept["findings"] == [] and kept["host"] == ""
        assert kept["read"]["torch"].startswith("2.13.")


def test_an_upgrade_is_found_stack_by_stack_here_and_over_ssh_and_refused_before_the_queue(
    cli, isolated, slurm_cluster, sshd, tmp_path
):
    current, retired = tmp_path / "current", tmp_path / "retired"
    repoint(current, "pe-2025")
    repoint(retired, "pe-2025")
    upgraded_profile(isolated, current, retired)
    before = cli("machines", "check", "upgraded")
    assert before.code == 0, before.out + before.err
    assert before.out.count("loads as the profile says") == 4, before.out

    repoint(current, "pe-2026")  # the facility's upgrade: a new default tree, the old one gone
    repoint(retired, None)
    after = cli("machines", "check", "upgraded", "--json")
    assert after.code == 1, after.out + after.err
    mine, debians = python_version(sys.executable), python_version("/usr/bin/python3")
    assert findings(after) == {
        "frameworks": [
            "MMM_TEST_CCL_SYNC=0; the profile says 1",
            "MMM_TEST_KVS_MODE is not set; the profile says mpi",
            "import torch failed: ModuleNotFoundError: No module named 'torch'",
            # Debian's python3 is another interpreter; its version differs where the venv's does
            *([f"python {debians}; the profile says {mine}"] if debians != mine else []),
        ],
        "frameworks-2025.3": [
            "`module load frameworks/2025.3` failed: Lmod has detected the following error: "
            'The following module(s) are unknown: "frameworks/2025.3"'
        ],
        "conda-2025-09": [
            "`module load conda/2025-09` failed: Lmod has detected the following error: "
            'The following module(s) are unknown: "gcc-native/14.3"'
        ],
        "old-pe": [
            f"module tree {retired} is not there",
            "`module load frameworks/2025.3` failed: Lmod has detected the following error: "
            'The following module(s) are unknown: "frameworks/2025.3"',
        ],
    }
    ssh_config(Path(os.environ["HOME"]), sshd)
    remote = cli("machines", "check", "upgraded", "--host", "login", "--json")
    assert remote.code == 1 and findings(remote) == findings(after), remote.out + remote.err
    assert software.last_check("upgraded", "conda-2025-09")["host"] == "login"

    refused = cli("submit", "upgraded", "--stack", "conda-2025-09", "-t", "00:02:00", "--", "true")
    assert refused.code == 2, refused.out + refused.err
    assert (
        refused.err.startswith("mmm-orch: error: stack conda-2025-09 of upgraded: the last check (")
        and " on login) found `module load conda/2025-09` "
    )
    assert '"gcc-native/14.3"' in refused.err and "mmm-orch machines check upgraded" in refused.err
    assert refused.err.count("\n") == 1
    assert_nothing_recorded()


def test_a_module_that_hangs_is_given_up_within_the_bound(cli, isolated, slurm_cluster):
    write_machine(
        isolated,
        "stalled",
        json.dumps(
            {
                "extends": "slurm-local",
                "name": "stalled",
                "stacks": [stack("stall", TREES / "stalled", "stall/1", default=True)],
            }
        ),
    )
    started = time.monotonic()
    result = cli("machines", "check", "stalled", "--timeout", "3")
    took = time.monotonic() - started
    assert result.code == 1, result.out + result.err
    assert (
        "  loading it did not finish within 3 s (stopped after 3 s): a module hangs at "
        "`module load stall/1`"
    ) in result.out
    assert took < 3 + 5, took  # the bound, the queue part and a shell's start
    hung = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "3600"]]
    assert hung == []  # the module's own child went with the shell's process group


@pytest.mark.parametrize("scheduler", ["slurm", "pbs"])
def test_a_job_on_a_moved_stack_stops_at_its_setup_line_and_status_names_the_module(
    cli, isolated, scheduler, request, leftovers_cancelled
):
    request.getfixturevalue("slurm_cluster" if scheduler == "slurm" else "pbs_server")
    base = "slurm-local" if scheduler == "slurm" else "pbs-local"
    write_machine(
        isolated,
        "moved",
        json.dumps(
            {  # written for pe-2025, run on pe-2026
                "extends": base,
                "name": "moved",
                "stacks": [stack("old", TREES / "pe-2026", "frameworks/2025.3", default=True)],
            }
        ),
    )
    submitted = cli("submit", "moved", "-t", "00:02:00", "--", "python3", "-c", "print('ran')")
    assert submitted.code == 0, submitted.err
    assert (
        "mmm-orch: note: stack old of moved has never been checked here; "
        "`mmm-orch machines check moved` checks it"
    ) in submitted.err
    row = wait_state(cli, 1)
    assert row["state"] == "failed" and row["reason"] == (
        "module frameworks/2025.3 not found: the stack has moved; `mmm-orch machines check moved`"
    ), row
    assert "module frameworks/2025.3 not found" in cli("status", "1").out
    log = cli("logs", "1").out
    # (Lmod wraps its words at 80 columns)
    assert 'The following module(s) are unknown: "frameworks/2025.3"' in " ".join(log.split())
    assert "[mmm-orch] setup_failed: exit=1 line=module load frameworks/2025.3" in log
    assert "launch_start" not in log and "ran" not in log.split("setup_failed")[1]
    diagnosed = cli("diagnose", "1", "--json")
    assert json.loads(diagnosed.out)["first"]["signature"] == "module-unknown", diagnosed.out
    assert row["end_class"] == "setup-failed"
    refused = cli("rerun", "1")  # the same plan would stop at the same line
    assert refused.code == 2 and "ended setup-failed (" in refused.err, refused.err
    assert len(json.loads(cli("status", "--all", "--json").out)) == 1  # recorded once


# --- in-process, no module system needed ------------------------------------------------------


def test_a_stack_the_last_check_found_broken_is_refused_and_an_old_check_noted(cli, isolated):
    software.save_checks(
        "slurm-local",
        "",
        [
            software.StackCheck(
                "frameworks-2025.3",
                [
                    "`module load frameworks/2025.3` failed: Lmod has detected the "
                    "following error: The following module(s) are unknown: "
                    '"frameworks/2025.3"'
                ],
            )
        ],
    )
    refused = cli("submit", "slurm-local", "-t", "00:02:00", "--", "true")
    assert refused.code == 2 and refused.err.count("\n") == 1, refused.err
    assert "stack frameworks-2025.3 of slurm-local: the last check (" in refused.err
    assert '"frameworks/2025.3"; fix the profile or pick another stack (--stack)' in refused.err
    assert_nothing_recorded()
    old = time.time() - (software.CHECK_MAX_AGE_DAYS + 1) * 86400
    software.save_checks("slurm-local", "", [software.StackCheck("frameworks-2025.3")], when=old)
    assert software.gate("slurm-local", "frameworks-2025.3") == (
        f"note: stack frameworks-2025.3 of slurm-local was last checked "
        f"{software.CHECK_MAX_AGE_DAYS + 1} days ago ({time.strftime('%Y-%m-%d %H:%M', time.localtime(old))}); "
        "`mmm-orch machines check slurm-local` checks it again"
    )
    software.save_checks("slurm-local", "", [software.StackCheck("frameworks-2025.3")])
    assert software.gate("slurm-local", "frameworks-2025.3") == ""


def test_an_unreadable_last_check_counts_as_none(isolated):
    kept = software.checks_dir() / "slurm-local.json"
    kept.parent.mkdir(parents=True)
    for text in ("{", "[]", '{"stacks": {"frameworks-2025.3": {"time": "x", "findings": []}}}'):
        kept.write_text(text)
        assert "has never been checked" in software.gate("slurm-local", "frameworks-2025.3")
    kept.unlink()
    os.mkfifo(kept)  # never blocks the submission
    assert "has never been checked" in software.gate("slurm-local", "frameworks-2025.3")


@pytest.mark.parametrize(
    "version,prefix,same",
    [
        ("2.13.0+cpu", "2.13", True),
        ("2.13.0a0+gitabc", "2.13.0", True),
        ("2.13.0", "2.1", False),
        ("3.12.1", "3.12", True),
        ("3.1.2", "3.12", False),
        ("2.10.1", "2.1", False),
    ],
)
def test_a_version_matches_its_prefix_at_a_component(version, prefix, same):
    assert software.same_version(version, prefix) is same


def test_the_script_stops_at_the_first_failed_setup_line(cli, isolated, tmp_path):
    """The rendered script's setup block, run by bash: a line that fails, one in a pipe, and a
    module system that says ERROR but exits 0 (Environment Modules 3.2) each stop it there."""
    blocks = {}
    for bad in (
        "false",
        "false | cat",
        "echo \"ModuleCmd_Load.c(213):ERROR:105: Unable to locate a modulefile for 'x'\" >&2",
    ):
        write_machine(
            isolated,
            "lines",
            json.dumps(
                {
                    "extends": "local",
                    "name": "lines",
                    "setup": ["export FIRST=1", bad, "export AFTER=1"],
                }
            ),
        )
        script = cli("submit", "lines", "--dry-run", "--", "true").out
        block = blocks[bad] = script[
            script.index("mmm_orch_setup() {") : script.index("export AFTER=1'") + 15
        ]
        ran = subprocess.run(
            ["bash", "-c", f"set -eo pipefail\n{block}\necho reached"],
            capture_output=True,
            text=True,
        )
        assert ran.returncode == 1, (bad, ran)
        assert ran.stdout == f"[mmm-orch] setup_failed: exit=1 line={bad}\n", ran.stdout
        assert "reached" not in ran.stdout
    # No room for a line's messages (mktemp fails): the line still runs, and still stops the job.
    nowhere = {**os.environ, "TMPDIR": str(tmp_path / "gone")}
    ran = subprocess.run(
        ["bash", "-c", f"set -eo pipefail\n{blocks['false']}\necho reached"],
        capture_output=True,
        text=True,
        env=nowhere,
    )
    assert (ran.returncode, ran.stdout) == (1, "[mmm-orch] setup_failed: exit=1 line=false\n")
    assert "mktemp" in ran.stderr


LMOD_LOG = (FIXTURES / "failures" / "lmod_unknown_dependency_testhost.log").read_text()


def test_status_and_diagnose_name_the_missing_dependency_from_lmods_words():
    from mmm_orch.config.failures import common_failures
    from mmm_orch.injob.diagnose import diagnose

    found = diagnose(LMOD_LOG, common_failures())
    assert found.first.signature.name == "module-unknown" and found.first.line_number == 1
    assert found.later == {"setup-line-failed": 1}
    assert setup_failure(LMOD_LOG, "polaris") == (
        "`module load conda/2025-09` needs module gcc-native/14.3, which is not found: the stack "
        "has moved; `mmm-orch machines check polaris`"
    )
    assert setup_failure("no setup failed here\n", "polaris") == ""


def test_the_help_states_the_bound_the_check_keeps(cli):
    said = " ".join(cli("machines", "--help").out.split())
    assert f"(a module that hangs); default {software.STACK_TIMEOUT}" in said
