"""Before a job reaches a scheduler: where it is submitted from (here, or a login host over SSH)
and whether the job's own Python (the profile's setup lines and job environment, on the host that
submits) imports mmm_orch at this version. Nothing here writes a record or a job file."""

from __future__ import annotations

import shutil

from mmm_orch.errors import MmmError
from mmm_orch.hosts import host_for
from mmm_orch.hosts import job_envs as envs
from mmm_orch.planning import Plan
from mmm_orch.schedulers import scheduler_for, scheduler_kind


def target_for(plan: Plan, host: str | None) -> str:
    """The SSH target to submit through, '' for here: --host when given; else here when the
    machine's submit command is on PATH (we are on its login node); else its first login host."""
    return login_target(
        plan.machine, plan.scheduler, plan.scheduler_commands, plan.transport.login_hosts, host
    )


def login_target(
    machine: str, kind: str, commands: dict[str, str], login_hosts, host: str | None
) -> str:
    if host is not None:
        if not scheduler_kind(kind).batch:
            raise MmmError(
                f"--host {host!r}: machine {machine} runs jobs on this computer; "
                "--host is for machines with a batch scheduler"
            )
        return host
    submit_command = scheduler_for(kind, commands).submit_command
    if not submit_command or shutil.which(submit_command):
        return ""
    if login_hosts:
        return login_hosts[0]
    raise MmmError(
        f"machine {machine}: {submit_command} is not on PATH here and the profile "
        "lists no login_hosts; run on its login node or give --host HOST"
    )


def check_job_python(plan: Plan, remote: str) -> None:
    """Before anything reaches the scheduler: the job's own interpreter (the setup lines and the
    environment's activation, run where the job is submitted) imports mmm_orch at this version.
    A success is remembered per environment and mmm-orch build, so it costs nothing next time."""
    if plan.launch.python_is_submitters:
        return  # the job runs the very interpreter that is submitting it
    key = envs.check_key(
        plan.machine, remote, plan.environment.setup, plan.environment.path, plan.launch.python
    )
    if envs.checked_before(key):
        return
    activate = envs.activation(plan.environment.path) if plan.environment.path else ""
    result = host_for(remote).run(
        [
            "bash",
            "-lc",
            envs.check_script(plan.environment.setup, activate, plan.launch.python, quick=True),
        ],
        timeout=300,
    )
    report = envs.read_report(result.stdout)
    if report is None or report["mmm_orch"] != plan.mmm_orch_version:
        raise MmmError(
            envs.missing_message(plan.machine, report, remote, result.stderr or result.stdout)
        )
    envs.remember_check(key)
