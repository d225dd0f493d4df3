"""The job's own Python, as at a facility: the job runs `python3` after the profile's setup lines,
which give a separate interpreter with torch and without mmm_orch. Without a job environment,
submit refuses with the fix; `env create` makes one (here, and over SSH), and jobs on the live
Slurm and PBS test servers then complete in it, as it is and staged to each node's storage; a
broken one is diagnosed with the fix."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from helpers.jobs import assert_nothing_recorded, wait_state
from helpers.ssh import ssh_config


def facility_profile(isolated: Path, name: str, base: str, python_root: Path, envs: Path,
                     extra: str = "") -> None:
    machines = isolated / ".mmm-orch" / "machines"
    machines.mkdir(parents=True, exist_ok=True)
    (machines / f"{name}.yaml").write_text(
        f"extends: {base}\nname: {name}\npython: python3\n"
        f"setup: [{json.dumps('source ' + shlex.quote(str(python_root / 'bin' / 'activate')))}]\n"
        f"environment: {{path: {json.dumps(str(envs / name))}}}\n" + extra)


@pytest.fixture(params=["slurm", "pbs"])
def facility(request, isolated, facility_python, tmp_path, leftovers_cancelled):
    kind = request.param
    request.getfixturevalue("slurm_cluster" if kind == "slurm" else "pbs_server")
    name = f"facility-{kind}"
    facility_profile(isolated, name, "slurm-local" if kind == "slurm" else "pbs-local",
                     facility_python, tmp_path / "envs")
    return name


def test_without_an_environment_submit_refuses_with_the_fix(cli, isolated, facility_python,
                                                            tmp_path, slurm_cluster):
    """Refused before the scheduler is asked (the cluster only installs the sbatch that submit
    looks for first): the check runs the job's Python where jobs are submitted, on any
    scheduler."""
    facility_profile(isolated, "facility", "slurm-local", facility_python, tmp_path / "envs")
    result = cli("submit", "facility", "dist_check", "--nodes", "2")
    assert result.code == 2, result.err
    lines = result.err.strip().splitlines()
    assert len(lines) == 1
    assert "the job's Python for facility" in lines[0]
    assert "no virtual environment there to activate; fix it with `mmm-orch env create " \
        "facility`" in lines[0]
    assert "fix it with `mmm-orch env create facility`" in lines[0]
    assert_nothing_recorded()


def test_env_create_then_a_job_completes_in_it_and_in_its_staged_copy(cli, facility, tmp_path):
    created = cli("env", "create", facility)
    assert created.code == 0, created.err
    assert "created " in created.out and "installed mmm-orch 0.1.0" in created.out
    assert "torch:    2.13.0" in created.out
    env_dir = tmp_path / "envs" / facility
    assert (env_dir / "bin" / "python").exists()
    remembered = json.loads((Path(os.environ["XDG_CONFIG_HOME"]) / "mmm-orch" /
                             "environments.json").read_text())
    assert remembered[facility]["path"] == str(env_dir)
    assert "stack" not in remembered[facility]  # the profile's `setup:` form names none
    again = cli("env", "create", facility)  # idempotent: the same environment, updated in place
    assert again.code == 0 and "kept the virtual environment" in again.out
    check = cli("env", "check", facility)
    assert check.code == 0 and f"job environment of {facility}: {env_dir}" in check.out

    script = cli("submit", facility, "dist_check", "--nodes", "2", "--dry-run").out
    setup_at = script.index("source ") and script.index("/python/bin/activate")
    assert script.index(f"{env_dir}/bin/activate") > setup_at  # activated after the setup lines
    for words in ([], ["--stage-env"]):  # the second copied to each node's own storage first
        result = cli("submit", facility, "dist_check", "--nodes", "2", *words)
        assert result.code == 0, result.err
    plain, staged = wait_state(cli, 1), wait_state(cli, 2)
    log = cli("logs", "1").out
    assert plain["state"] == "completed", log[-3000:]
    assert "[dist_check] PASS world=4" in log
    log = cli("logs", "2").out
    assert staged["state"] == "completed", log[-3000:]
    assert "[mmm-orch] stage_start=" in log and "[mmm-orch] stage_end=" in log
    prefixes = {line.split(" python=")[1].split()[0] for line in log.splitlines()
                if line.startswith("[dist_check] rank=") and " python=" in line}
    assert len(prefixes) == 1 and prefixes.pop().startswith("/tmp/mmm-orch-env-")
    # The check is remembered: the next submit does not run the setup lines again.
    checks = Path(os.environ["XDG_CACHE_HOME"]) / "mmm-orch" / "env-checks.json"
    assert len(json.loads(checks.read_text())) == 1


@pytest.mark.parametrize("broken", ["missing", "without mmm-orch"])
def test_a_job_in_a_broken_environment_is_diagnosed_with_the_fix(cli, isolated, tmp_path,
                                                                 facility_python, broken,
                                                                 slurm_cluster,
                                                                 leftovers_cancelled):
    """On Slurm alone: the job script fails at its activation line, before any launch, whatever
    the scheduler."""
    facility = "facility-slurm"
    facility_profile(isolated, facility, "slurm-local", facility_python, tmp_path / "envs")
    if broken == "without mmm-orch":  # a plain venv where the environment should be
        subprocess.run([str(facility_python / "bin" / "python"), "-m", "venv", "--without-pip",
                        "--system-site-packages", str(tmp_path / "envs" / facility)], check=True)
    result = cli("submit", facility, "dist_check", "--no-env-check")
    assert result.code == 0, result.err
    assert wait_state(cli, 1)["state"] == "failed"
    diagnosis = cli("diagnose", "1")
    name = "job-environment-missing" if broken == "missing" else "mmm-orch-not-in-job-python"
    assert f"first failure: {name}" in diagnosis.out, cli("logs", "1").out[-2000:]
    assert f"mmm-orch env create {facility}" in diagnosis.out


def test_env_create_over_ssh_then_a_remote_submit_passes_its_check(cli, isolated,
                                                                   facility_python, sshd,
                                                                   tmp_path, slurm_cluster,
                                                                   leftovers_cancelled):
    """The job is submitted to the parked partition (it never runs): a remote job that runs is
    test_remote's, one that runs in a created environment is the test above's."""
    ssh_config(Path(os.environ["HOME"]), sshd)
    facility_profile(isolated, "facility-ssh", "slurm-local", facility_python,
                     tmp_path / "remote-envs",
                     extra=f"remote_jobs_dir: {tmp_path / 'remote-jobs'}\n")
    refused = cli("submit", "facility-ssh", "dist_check", "--host", "login")
    assert refused.code == 2 and "mmm-orch env create facility-ssh" in refused.err
    created = cli("env", "create", "facility-ssh", "--host", "login")
    assert created.code == 0, created.err
    assert "on login" in created.out and "installed mmm-orch" in created.out
    uploaded = next(line for line in created.out.splitlines() if line.startswith("uploaded "))
    assert Path(uploaded.split(" to ")[1].removesuffix(" on login")).exists()  # via SFTP
    assert (tmp_path / "remote-envs" / "facility-ssh" / "bin" / "python").exists()
    result = cli("submit", "facility-ssh", "dist_check", "--nodes", "2", "--host", "login",
                 "-q", "parked")
    assert result.code == 0, result.err
    assert wait_state(cli, 1, ("pending",))["remote"] == "login"
    assert cli("cancel", "1").code == 0


def test_env_create_refuses_what_it_cannot_use(cli, isolated):
    result = cli("env", "create", "local")
    assert result.code == 2 and "machine local has no job environment" in result.err
    result = cli("env", "create", "local", "--path", "relative/dir")
    assert result.code == 2 and "--path 'relative/dir' is invalid" in result.err
    result = cli("env", "create", "aurora")
    assert result.code == 2 and "--account is needed on aurora" in result.err


@pytest.mark.parametrize("machine,module", [
    ("aurora", "module load frameworks/2026.1.0"),
    ("polaris", "conda activate base"),
    ("perlmutter", "module load"),
    ("frontier", "module load PrgEnv-gnu/8.7.0"),
])
def test_facility_scripts_activate_the_environment_after_the_modules(cli, machine, module):
    script = cli("render", machine, "fsdp", "-A", "PROJ1").out
    lines = script.splitlines()
    last_module = max(i for i, line in enumerate(lines) if module in line)
    activate = next(i for i, line in enumerate(lines) if line.startswith("source ")
                    and line.endswith("/bin/activate"))
    assert last_module < activate < lines.index("# Environment, grouped by preset")
    assert f"`mmm-orch env create {machine}` makes it" in lines[activate - 1]
    assert "$USER" in lines[activate]  # expands where the job runs


def test_a_remembered_environment_replaces_the_profile_default(cli, isolated):
    config = Path(os.environ["XDG_CONFIG_HOME"]) / "mmm-orch"
    config.mkdir(parents=True)
    (config / "environments.json").write_text(json.dumps(
        {"aurora": {"path": "/lus/flare/projects/P/me/envs/my env", "host": "", "version": "0.1.0"}}))
    script = cli("render", "aurora", "fsdp", "-A", "P").out
    assert "source '/lus/flare/projects/P/me/envs/my env'/bin/activate" in script


def test_staging_copies_the_environment_once_per_node(cli):
    script = cli("render", "aurora", "fsdp", "-A", "P", "-N", "2", "--stage-env").out
    assert "mpiexec -n 2 -ppn 1 bash -c" in script
    assert 'export PATH="$VIRTUAL_ENV/bin:$PATH"' in script
    refused = cli("render", "local", "fsdp", "--stage-env")
    assert refused.code == 2 and "local has no job environment to stage" in refused.err
