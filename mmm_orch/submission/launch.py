"""`mmm-orch launch`: a plan run inside an allocation the scheduler already gave (interactive, or
a batch script someone else wrote). The script is the one a batch job of the same plan would
run, rendered by the same template; it runs on this node under the local executor's supervisor
(walltime, cancel, exit code), on the allocation's nodes through the machine's launcher; or,
with --allocate, in an allocation asked for here and recorded as a job of its own."""

from __future__ import annotations

import json
import os
import posixpath
import pty
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil

from mmm_orch.errors import MmmError
from mmm_orch.hosts import host_for
from mmm_orch.hosts import job_envs as envs
from mmm_orch.hosts.transport import LocalRunner
from mmm_orch.injob import protocol
from mmm_orch.planning import Plan
from mmm_orch.records.db import open_db
from mmm_orch.schedulers import scheduler_for
from mmm_orch.schedulers.allocation import Allocation
from mmm_orch.schedulers.base import Allocating
from mmm_orch.submission.settle import forget
from mmm_orch.submission.submit import (
    cancel,
    copy_keeper,
    job_dirs,
    record_values,
    signals_as_interrupts,
    submission_of,
)


def check_program(plan: Plan, program: str) -> None:
    """Before anything is recorded: the command's program is found here (inside the allocation,
    or on the machine that runs jobs here), where the job looks for it (on PATH after the setup
    lines and the job environment, in the shell the job script runs in)."""
    lines = [
        *plan.environment.setup,
        *([envs.activation(plan.environment.path)] if plan.environment.path else []),
        *(
            [f'export PATH={shlex.quote(plan.launch.python_dir)}:"$PATH"']
            if plan.launch.python_is_submitters
            else []
        ),
        'command -v -- "$1" >/dev/null',
    ]
    shell = "-lc" if plan.environment.login_shell else "-c"
    result = LocalRunner().run(["bash", shell, "\n".join(lines), "bash", program], timeout=300)
    if result.returncode != 0:
        raise MmmError(
            f"command after -- is invalid: {program!r} is not found where the job "
            f"runs (on PATH after {plan.machine}'s setup lines and job environment); "
            "give its path, or install it"
        )


def allocate_argv(
    plan: Plan, command: list[str] | None = None, name: str = "", tag: str = ""
) -> list[str]:
    """The command that gets an allocation for `plan` (its account, queue, walltime and resource
    directives), running `command` in it (else a shell)."""
    scheduler = _allocating(plan)
    directives = [
        word
        for line in (*plan.queue.directives, *plan.queue.resources)
        for word in shlex.split(line)
    ]
    return scheduler.allocate_argv(
        plan.queue.account, plan.queue.walltime_hms, directives, command, name, tag
    )


def _allocating(plan: Plan) -> Allocating:
    """The plan's scheduler, one of those that give interactive allocations."""
    scheduler = scheduler_for(plan.scheduler, plan.scheduler_commands)
    if not isinstance(scheduler, Allocating):
        raise MmmError(
            f"machine {plan.machine} schedules with {plan.scheduler}, which gives no "
            "allocations to launch in"
        )
    return scheduler


def check_fits(plan: Plan, allocation: Allocation) -> None:
    """Before anything is recorded: the allocation grants each node the CPUs the plan's ranks
    take there (a bare `salloc -N 2` on shared nodes grants one a node, and srun would refuse
    the launch inside the job)."""
    layout = plan.layout
    needed = layout.ranks_per_node * layout.cpus_per_rank
    granted = allocation.cpus_per_node
    if granted is not None and granted < needed:
        raise MmmError(
            f"{allocation.scheduler} job {allocation.job_id} is invalid for this "
            f"launch: it grants {granted} CPU{'s' if granted > 1 else ''} on a node "
            f"({allocation.cpus_said_by}), and the plan runs {layout.ranks_per_node} "
            f"ranks x {layout.cpus_per_rank} CPU{'s' if layout.cpus_per_rank > 1 else ''}"
            f" a node; get one that fits with `{allocation_hint(plan)}`"
        )


def allocation_hint(plan: Plan) -> str:
    return shlex.join(allocate_argv(plan))


def write_exit_report(path: str, code: int) -> None:
    """What `launch --report-to PATH` leaves for `launch --allocate` outside the allocation: the
    launched job's exit code (salloc passes it on; qsub -I returns 0 whatever ran in it)."""
    partial = f"{path}.partial"
    with open(partial, "w", encoding="utf-8") as out:
        json.dump({"exit_code": code}, out)
    os.replace(partial, path)


def read_exit_report(path: Path) -> int | None:
    """The exit code write_exit_report left at `path` (the file removed), or None."""
    try:
        code = json.loads(path.read_text())["exit_code"]
        path.unlink()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return code if isinstance(code, int) else None


def run_allocation(plan: Plan, argv: list[str]) -> None:
    """Run allocate_argv's `argv` in the foreground, this process's terminal its own; under a
    pseudo-terminal where the scheduler wants one and this process has none (qsub -I in a
    script). What runs inside reports to the caller by a file. Interrupted, the command goes
    with it (what it asked the scheduler for is then the caller's to cancel)."""
    scheduler = _allocating(plan)
    if not scheduler.allocate_needs_terminal or (sys.stdin.isatty() and sys.stdout.isatty()):
        subprocess.run(argv, check=False)  # (an interrupt kills the command)
        return

    sys.stdout.flush()
    try:
        pty.spawn(argv)  # copies the terminal's output to our stdout, and our stdin to it
    except BaseException:
        for child in psutil.Process().children():
            child.kill()
        raise


def allocate(
    plan: Plan,
    db_file: Path,
    argv_for: Callable[[str, str], list[str]],
    run: Callable[[list[str]], None],
) -> None:
    """`launch --allocate`'s allocation, a job of its own: recorded before the scheduler is
    asked, asked for by `argv_for(name, tag)` (salloc, qsub -I: the job carries the name and
    tag a batch job does), waited for in the foreground by `run`, then settled by its tag: its
    id once the scheduler shows the job, or no record when the scheduler has none. A SIGTERM,
    SIGHUP or Ctrl-C ends the wait and cancels what was asked for; killed outright, mmm-orch
    leaves the record `submitting` for `status` to find the allocation by its tag, as after an
    interrupted submit (and to end it, or `mmm-orch cancel` it)."""
    scheduler = scheduler_for(plan.scheduler, plan.scheduler_commands)
    tag, local_dir, job_dir = job_dirs(plan, db_file, "", "")
    plan = plan.placed(
        job_dir, tag, scheduler.directive_path(posixpath.join(job_dir, protocol.LOG_FILE)), None
    )
    argv = argv_for(plan.name, tag)
    values = record_values(plan, "", "", shlex.join(argv))
    db = open_db(str(db_file), create=True)
    created = host_for("").make_private_dir(str(local_dir))
    job_id = None
    try:
        with signals_as_interrupts():
            job_id = db.insert(**values)
    except BaseException:
        if job_id is not None:
            db.delete(job_id)
        host_for("").remove_tree(created)
        raise
    submission = submission_of(plan, job_dir, job_dir, tag, values["submitted_at"])
    try:
        with signals_as_interrupts():
            run(argv)
    except OSError as exc:  # no salloc or qsub here: nothing was asked for
        forget(db, db.get_existing(job_id, events=False))
        raise MmmError(f"--allocate: cannot run {argv[0]}: {exc.strerror}") from None
    except KeyboardInterrupt:  # (SIGTERM and SIGHUP too)
        found = scheduler.find(submission)
        if found:  # asked for and not wanted any more: nothing of it may stay queued
            db.accepted(job_id, found[0], "allocation interrupted: cancelled")
            cancel(db, db.get_existing(job_id, events=False))
        raise
    found = scheduler.find(submission)
    if found:  # the record's own copy first, as submit writes it (what `db recover` reads)
        copy_keeper(local_dir, {"id": job_id, **values})(found[0])
        db.accepted(job_id, found[0])
    elif found is not None:  # the scheduler answered that it has no such job: it refused
        forget(db, db.get_existing(job_id, events=False))
