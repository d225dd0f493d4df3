"""Software stacks as dated data (issue 51): the profile's `stacks:`, `--stack NAME`, and what
the plan, the script, the job record and the job environment say about the stack."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.jobs import assert_nothing_recorded
from helpers.profiles import facility_profiles
from mmm_orch.config import registry
from mmm_orch.errors import ConfigError, MmmError


def user_machines(root: Path) -> Path:
    path = root / ".mmm-orch" / "machines"
    path.mkdir(parents=True, exist_ok=True)
    return path


TWO_STACKS = """\
extends: local
stacks:
  - name: new-1.0
    date: "2026-11-28"
    source: "the facility's page (2026-11-28)"
    module_tree: /opt/new/modulefiles
    setup: [module load frameworks/new]
    gives: {torch: "2.13", python: "3.12"}
    sets: {CCL_OP_SYNC: "0"}
  - name: old-0.9
    default: true
    date: "2026-03-01"
    source: "the facility's page (2026-03-01)"
    setup: [module load frameworks/old]
"""


def test_a_profile_names_its_stacks_and_the_default(isolated):
    (user_machines(isolated) / "two.yaml").write_text(TWO_STACKS)
    machine = registry.load_machine("two")
    assert [s.name for s in machine.stacks] == ["new-1.0", "old-0.9"]
    assert machine.stack(None).name == "old-0.9"  # the one marked default, not the first
    new = machine.stack("new-1.0")
    assert new.lines() == ['module use "/opt/new/modulefiles"', "module load frameworks/new"]
    assert new.gives == {"torch": "2.13", "python": "3.12"} and new.sets == {"CCL_OP_SYNC": "0"}
    assert machine.setup == []
    # Read again from the validated-profile cache: the same stacks.
    registry.cache._memo.clear()
    assert registry.load_machine("two").stacks == machine.stacks


def test_without_a_default_mark_the_first_stack_is_the_default(isolated):
    (user_machines(isolated) / "two.yaml").write_text(TWO_STACKS.replace("    default: true\n", ""))
    assert registry.load_machine("two").stack(None).name == "new-1.0"


def test_an_unknown_stack_is_refused_naming_the_stacks(isolated):
    (user_machines(isolated) / "two.yaml").write_text(TWO_STACKS)
    with pytest.raises(MmmError, match=r"^--stack nope: machine two has stacks new-1.0, old-0.9$"):
        registry.load_machine("two").stack("nope")


def test_the_older_setup_form_is_one_stack_named_default(isolated):
    (user_machines(isolated) / "mine.yaml").write_text(
        "extends: local\nsetup: [module load python/3.12]\n"
    )
    machine = registry.load_machine("mine")
    assert [(s.name, s.lines(), s.date) for s in machine.stacks] == [
        ("default", ["module load python/3.12"], "")
    ]
    registry.cache._memo.clear()
    assert registry.load_machine("mine").stack(None).lines() == ["module load python/3.12"]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            TWO_STACKS + "setup: [module load x]\n",
            r"setup and stacks: give the setup lines in a stack",
        ),
        (
            TWO_STACKS.replace('    date: "2026-03-01"\n', ""),
            r"stack old-0.9: date and source are required",
        ),
        (
            TWO_STACKS.replace('"2026-11-28"\n', '"28.11.2026"\n'),
            r"date '28.11.2026': .*YYYY-MM-DD",
        ),
        (TWO_STACKS.replace('torch: "2.13"', "torch: 2.10"), r"quote the version"),
        (TWO_STACKS.replace("old-0.9", "new-1.0"), r"stack names repeat: new-1.0"),
        (TWO_STACKS.replace("name: old-0.9", "name: 'old 0.9'"), r"stack name 'old 0.9'"),
        (
            TWO_STACKS.replace("{CCL_OP_SYNC", "{CCL-OP", 1),
            r"not a valid environment variable name",
        ),
    ],
    ids=[
        "setup-and-stacks",
        "no-date",
        "bad-date",
        "unquoted-version",
        "repeated",
        "bad-name",
        "bad-var",
    ],
)
def test_a_stack_written_wrong_is_a_load_error_naming_it(isolated, text, error):
    (user_machines(isolated) / "bad.yaml").write_text(text)
    with pytest.raises(ConfigError, match=error):
        registry.load_machine("bad")


@pytest.mark.parametrize("name", facility_profiles())
def test_every_facility_stack_is_dated_and_cited(name):
    machine = registry.load_machine(name)
    for stack in machine.stacks:
        assert stack.date and stack.source.strip() and stack.setup, (name, stack.name)


# --- the plan, the script, the record ---------------------------------------------------------


def test_aurora_dry_run_names_the_default_stack_and_syncs_oneccl_on_many_nodes(cli):
    """Acceptance (issue 51): ALCF's default stack today, oneCCL synchronisation for a job of
    more than one node, each with its source."""
    result = cli("submit", "aurora", "llama3_8b", "--nodes", "4", "-A", "P", "--dry-run")
    assert result.code == 0, result.err
    script = result.out
    assert "# Software stack: frameworks-2026.1.0 (facts of 2026-11-28: ALCF-UG " in script
    assert (
        "mmm_orch_setup 'module use \"/opt/aurora/26.181.0/modulefiles\"'\n"
        "mmm_orch_setup 'module load frameworks/2026.1.0'\n" in script
    )
    assert "frameworks/2025.3.1" not in script
    sync = script.index("# -- preset oneccl-sync-multinode")
    assert "source: ALCF-UG aurora/data-science/frameworks/frameworks.md" in script[sync:]
    assert 'export CCL_OP_SYNC="1"\nexport CCL_ATL_SYNC_COLL="1"' in script[sync:]
    one_node = cli("submit", "aurora", "llama3_8b", "--nodes", "1", "-A", "P", "--dry-run").out
    assert "CCL_OP_SYNC" not in one_node and "CCL_ATL_SYNC_COLL" not in one_node


def test_stack_picks_an_older_stack_with_its_module_tree(cli):
    result = cli(
        "submit",
        "aurora",
        "llama3_8b",
        "--nodes",
        "1",
        "-A",
        "P",
        "--dry-run",
        "--stack",
        "frameworks-2025.3.1",
    )
    assert result.code == 0, result.err
    assert "# Software stack: frameworks-2025.3.1 (facts of 2026-03-17: " in result.out
    assert (
        "mmm_orch_setup 'module use \"/opt/aurora/26.26.0/modulefiles\"'\n"
        "mmm_orch_setup 'module load frameworks/2025.3.1'\n" in result.out
    )
    assert "frameworks/2026.1.0" not in result.out


@pytest.mark.parametrize("command", ["submit", "sweep", "render"])
def test_an_unknown_stack_is_refused_before_anything_is_written(cli, isolated, command):
    args = [command, "aurora", "llama3_8b", "-A", "P", "--stack", "frameworks-1999"]
    if command != "render":
        args.append("--dry-run")
    result = cli(*args)
    assert result.code == 2
    [line] = result.err.strip().splitlines()
    assert line.startswith("mmm-orch: error: ") and line.endswith(
        "--stack frameworks-1999: machine aurora has stacks frameworks-2026.1.0, frameworks-2025.3.1"
    )
    assert not any((isolated.parent / "state").rglob("*"))  # no record, no job directory


def test_the_plan_and_its_record_carry_the_stack(isolated):
    from mmm_orch import api
    from mmm_orch.planning.store import stored_plan

    plan = api.plan("aurora", "llama3_8b", nodes=2, account="P", stack="frameworks-2025.3.1")
    env = plan.environment
    assert (env.stack, env.stack_date) == ("frameworks-2025.3.1", "2026-03-17")
    recorded = json.loads(json.dumps(plan.to_dict()))  # as the job database keeps it
    assert recorded["environment"]["stack"] == "frameworks-2025.3.1"
    assert stored_plan(recorded, "job 1's plan").environment == env
    # A record made before stacks (no stack in it) still reads, naming none.
    del recorded["environment"]["stack"]
    assert stored_plan(recorded, "job 1's plan").environment.stack == ""


def test_a_workload_spec_picks_a_stack_per_machine_and_the_option_wins(cli, isolated):
    workloads = isolated / ".mmm-orch" / "workloads"
    workloads.mkdir(parents=True)
    (workloads / "mine.yaml").write_text(
        "extends: llama3_8b\nmachines:\n  aurora: {stack: frameworks-2025.3.1}\n"
    )
    spec = cli("render", "aurora", "mine", "-A", "P", "--nodes", "1")
    assert spec.code == 0, spec.err
    assert "module load frameworks/2025.3.1" in spec.out
    chosen = cli(
        "render", "aurora", "mine", "-A", "P", "--nodes", "1", "--stack", "frameworks-2026.1.0"
    )
    assert "module load frameworks/2026.1.0" in chosen.out


# --- the job environment's stack -------------------------------------------------------------


def test_a_job_on_another_stack_than_its_environment_is_refused_with_the_command(cli, isolated):
    from mmm_orch.hosts import job_envs as envs

    envs.remember(
        "aurora",
        {
            "path": "/lus/flare/projects/P/me/venv",
            "host": "",
            "version": "x",
            "stack": "frameworks-2025.3.1",
        },
    )
    refused = cli("submit", "aurora", "llama3_8b", "--nodes", "1", "-A", "P", "--dry-run")
    assert refused.code == 2
    assert refused.err.strip().splitlines() == [
        "mmm-orch: error: --stack frameworks-2026.1.0: the job environment of aurora "
        "(/lus/flare/projects/P/me/venv) was made on stack frameworks-2025.3.1; make one on "
        "frameworks-2026.1.0 in a new directory: `mmm-orch env create aurora --stack "
        "frameworks-2026.1.0 --path DIR`, or submit with --stack frameworks-2025.3.1"
    ]
    same = cli(
        "submit",
        "aurora",
        "llama3_8b",
        "--nodes",
        "1",
        "-A",
        "P",
        "--dry-run",
        "--stack",
        "frameworks-2025.3.1",
    )
    assert same.code == 0, same.err
    assert "source /lus/flare/projects/P/me/venv/bin/activate" in same.out


LOCAL_STACKS = """\
extends: local
python: python3
environment: {path: "%s"}
stacks:
  - name: old
    date: "2026-03-01"
    source: "this test"
    setup: [export MMM_TEST_STACK=old]
  - name: new
    default: true
    date: "2026-11-28"
    source: "this test"
    setup: [export MMM_TEST_STACK=new]
"""


@pytest.mark.slow  # makes a virtual environment and installs this mmm-orch in it
def test_env_create_records_its_stack_and_a_job_on_another_is_refused(cli, isolated, tmp_path):
    from mmm_orch.hosts import job_envs as envs

    (user_machines(isolated) / "site.yaml").write_text(LOCAL_STACKS % (tmp_path / "venv"))
    created = cli("env", "create", "site", "--stack", "old")
    assert created.code == 0, created.err
    assert "jobs on site (stack old) now activate" in created.out
    assert envs.remembered("site")["stack"] == "old"
    assert cli("env", "check", "site").code == 0  # checked on the stack it was made on
    refused = cli("submit", "site", "fsdp")  # the default stack: new
    assert refused.code == 2
    assert (
        "was made on stack old; make one on new in a new directory: `mmm-orch env create "
        "site --stack new --path DIR`" in refused.err
    )
    assert_nothing_recorded()
    script = cli("submit", "site", "fsdp", "--stack", "old", "--dry-run")
    assert script.code == 0, script.err
    assert "mmm_orch_setup 'export MMM_TEST_STACK=old'\n" in script.out


# --- MPI before the process group (CCL_KVS_MODE=mpi) ------------------------------------------


def _trainer_start(kvs_mode: str | None, libraries: Path | None = None) -> subprocess.CompletedProcess:
    """The dist_check trainer's start on this CPU (one rank, gloo), as a job starts it."""
    env = {k: v for k, v in os.environ.items() if k not in ("CCL_KVS_MODE", "LD_LIBRARY_PATH")}
    env.update(MMM_DEVICE="cpu", MMM_BACKEND="gloo")
    if kvs_mode is not None:
        env["CCL_KVS_MODE"] = kvs_mode
    if libraries is not None:
        env["LD_LIBRARY_PATH"] = str(libraries)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mmm_orch.trainers.dist_check",
            "--sizes",
            "4",
            "--iters",
            "1",
            "--warmup",
            "0",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.slow  # starts torch and a process group, three times
def test_with_kvs_mode_mpi_the_runtime_initialises_mpi_before_the_process_group(tmp_path):
    """ALCF-UG frameworks.md (2026-11-28): with CCL_KVS_MODE=mpi the application initialises MPI
    (`import mpi4py`) before the process group. mpi4py (the test extras, 4.1.2 as in Aurora's
    frameworks/2026.1.0) loads the MPICH ABI's library, libmpi.so.12: this host's MPICH (the test
    servers' package) is that ABI under the name libmpich.so.12."""
    (mpich,) = glob.glob("/usr/lib/*/libmpich.so.12")
    abi = tmp_path / "mpich-abi"
    abi.mkdir()
    (abi / "libmpi.so.12").symlink_to(mpich)
    started = _trainer_start("mpi", abi)
    assert started.returncode == 0, started.stderr[-2000:]
    lines = started.stderr.splitlines() + started.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("[dist_check] rank=0"))
    mpi = lines.index("[runtime] MPI initialised before the process group (CCL_KVS_MODE=mpi): True")
    assert mpi < first
    # Without an MPI library mpi4py cannot start MPI: one line, before the process group.
    missing = _trainer_start("mpi")
    assert missing.returncode == 2
    said = [line for line in missing.stderr.splitlines() + missing.stdout.splitlines() if line]
    assert len(said) == 1 and said[0].startswith(
        "[runtime] error: CCL_KVS_MODE=mpi needs MPI initialised before the process group, by "
        "mpi4py, which cannot start here (cannot load MPI library): install mpi4py and an MPI "
        "library in the job environment, or run without CCL_KVS_MODE=mpi"
    ), said
    # Any other KVS mode, or none: no MPI at all, and the trainer starts as before.
    for mode in (None, "pmi"):
        plain = _trainer_start(mode)
        assert plain.returncode == 0, plain.stderr[-2000:]
        assert "[dist_check] PASS world=1" in plain.stdout
        assert "MPI" not in plain.stderr
