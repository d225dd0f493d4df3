"""`mmm-orch launch`: a plan run inside an allocation the scheduler already gave (interactive, or
a batch script someone else wrote). The script is the one a batch job of the same plan would
run, rendered by the same template; it runs on this node under the local executor's supervisor
(walltime, cancel, exit code), on the allocation's nodes through the machine's launcher; or,
with --allocate, in an allocation asked for here and recorded as a job of its own."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import posixpath
import re
import shlex
from pathlib import Path
from typing import Callable

from mmm_orch.errors import MmmError
from mmm_orch.hosts import host_for
from mmm_orch.injob import protocol
from mmm_orch.jobs.db import open_db
from mmm_orch.jobs.submit import (cancel, copy_keeper, forget, job_dirs, record_values,
                                  signals_as_interrupts)
from mmm_orch.planning import Plan, Request
from mmm_orch.schedulers import scheduler_for
from mmm_orch.schedulers.allocation import Allocation, node_names
from mmm_orch.schedulers.base import Submission
from mmm_orch.transport import LocalRunner


def as_the_profile_lists(machine: str, node_list: str, allocation: Allocation) -> Allocation:
    """The allocation's nodes as the machine's profile lists them (scheduler.node_list: the
    test server's vnodes share one host, so its node file names that host once), else as the
    scheduler's variables do."""
    if not node_list:
        return allocation
    result = LocalRunner().run(["bash", "-c", node_list], timeout=60)
    nodes = tuple(node_names(result.stdout, f"machine {machine}: scheduler.node_list"))
    if result.returncode != 0 or not nodes:
        raise MmmError(f"machine {machine}: scheduler.node_list found no nodes in "
                       f"{allocation.scheduler} job {allocation.job_id} (exit {result.returncode}: "
                       f"{result.stderr.strip()[:200]})")
    return dataclasses.replace(allocation, nodes=nodes)


def which_machine(named: str, allocation: Allocation | None, hostname: str) -> str:
    """The machine `launch` runs on: `named` when given (refused when this allocation's nodes
    match other profiles' hostnames and not its own), else the one profile whose hostnames match
    the allocation's first node, or this host outside any; `local` where none does outside one."""
    if named and allocation is None:
        return named  # no nodes to contradict it: the profiles need not be read
    matching, declaring = _matching_profiles(allocation, hostname)
    where = (f"{allocation.scheduler} job {allocation.job_id} (first node "
             f"{allocation.nodes[0] if allocation.nodes else 'none'})" if allocation
             else f"this host ({hostname})")
    if named:  # (one of another scheduler than the allocation's is refused with that reason)
        same_kind = allocation is None or declaring.get(named) == allocation.scheduler
        if matching and named not in matching and named in declaring and same_kind:
            raise MmmError(f"machine {named!r} is invalid here: {where} matches the hostnames of "
                           f"{', '.join(matching)}, not {named}'s; leave MACHINE out or name it")
        return named
    if len(matching) == 1:
        return matching[0]
    if matching:
        raise MmmError(f"MACHINE is missing: {where} matches the hostnames of "
                       f"{', '.join(matching)}; name one")
    if allocation is None:
        return "local"
    raise MmmError(f"MACHINE is missing: no machine profile's hostnames match {where}; name it "
                   "(`mmm-orch machines`), or give its profile `hostnames:`")


def _matching_profiles(allocation: Allocation | None,
                       hostname: str) -> tuple[list[str], dict[str, str]]:
    """The profiles whose hostnames match (inside an allocation: its first node as the scheduler
    names it), and every profile that declares hostnames, with its scheduler's kind. Matching
    reads the profiles as data: a profile's commands (scheduler.node_list) run only once it is
    the machine in use, never to find out whether it is (a colleague's profile in the directory
    would otherwise run its node_list here)."""
    from mmm_orch.config import registry

    matching: list[str] = []
    declaring: dict[str, str] = {}
    for name in registry.names("machines"):
        try:
            machine = registry.load_machine(name)
        except MmmError:
            continue  # a broken profile is reported when it is named, not here
        if not machine.hostnames:
            continue
        declaring[name] = machine.scheduler.kind
        if allocation is not None and machine.scheduler.kind != allocation.scheduler:
            continue
        host = hostname
        if allocation is not None:
            host = allocation.nodes[0] if allocation.nodes else ""
        if any(re.fullmatch(pattern, host) for pattern in machine.hostnames):
            matching.append(name)
    return matching, declaring


def nodes_for(allocation: Allocation, request: Request, first_node: int,
              bad: tuple[str, ...]) -> tuple[str, ...]:
    """The allocation's nodes the launch runs on: all but the known-bad ones (`bad`), or
    `request.nodes` of them from `first_node` on (two launches side by side take disjoint ones)."""
    pool = [node for node in allocation.nodes if node not in bad]
    left_out = f" ({len(allocation.nodes) - len(pool)} known-bad left out: `mmm-orch nodes`)" \
        if len(pool) < len(allocation.nodes) else ""
    if first_node < 0 or first_node >= max(len(pool), 1):
        raise MmmError(f"--first-node {first_node} is invalid: {allocation.scheduler} job "
                       f"{allocation.job_id} has {len(pool)} usable nodes{left_out}, numbered from 0")
    count = request.nodes if request.nodes is not None else len(pool) - first_node
    if count < 1 or first_node + count > len(pool):
        raise MmmError(f"--nodes {count} is invalid: {allocation.scheduler} job "
                       f"{allocation.job_id} has {len(pool)} usable nodes{left_out}"
                       + (f", {len(pool) - first_node} of them from node {first_node}" if first_node else ""))
    return tuple(pool[first_node:first_node + count])


def placed_on(plan: Plan, allocation: Allocation, nodes: tuple[str, ...], jobs_root: Path) -> Plan:
    """`plan` run in the current directory, on `nodes`: the launcher's own default where they are
    the whole allocation, its words for "these nodes" (the profile's launcher.on_nodes) where
    they are some of it."""
    queue = dataclasses.replace(plan.queue, submit_dir_var="")  # here, not where the allocation began
    plan = dataclasses.replace(plan, queue=queue)
    if nodes == allocation.nodes:
        return plan
    words = plan.placement.on_nodes
    if not words:
        raise MmmError(f"--nodes {len(nodes)}: {plan.machine}'s launcher cannot run on some of the "
                       "allocation's nodes (its profile has no launcher.on_nodes)")
    hostfile = ""
    if "{hostfile}" in words:  # named by its content: the same nodes reuse one file
        text = "".join(f"{node}\n" for node in nodes)
        path = jobs_root / f"launch-hosts-{hashlib.sha256(text.encode()).hexdigest()[:16]}.txt"
        if not path.exists():
            jobs_root.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f".{path.name}.{os.getpid()}")
            partial.write_text(text)
            partial.replace(path)
        hostfile = str(path)
    hosts = words.format(nodelist=shlex.quote(",".join(nodes)), hostfile=shlex.quote(hostfile))
    return plan.with_launch(hosts=hosts)


def check_program(plan: Plan, program: str) -> None:
    """Before anything is recorded: the command's program is found here (inside the allocation,
    or on the machine that runs jobs here), where the job looks for it (on PATH after the setup
    lines and the job environment, in the shell the job script runs in)."""
    from mmm_orch import envs

    lines = [*plan.environment.setup,
             *([envs.activation(plan.environment.path)] if plan.environment.path else []),
             *([f'export PATH={shlex.quote(plan.launch.python_dir)}:"$PATH"']
               if plan.launch.python_is_submitters else []),
             'command -v -- "$1" >/dev/null']
    shell = "-lc" if plan.environment.login_shell else "-c"
    result = LocalRunner().run(["bash", shell, "\n".join(lines), "bash", program], timeout=300)
    if result.returncode != 0:
        raise MmmError(f"command after -- is invalid: {program!r} is not found where the job "
                       f"runs (on PATH after {plan.machine}'s setup lines and job environment); "
                       "give its path, or install it")


def allocate_argv(plan: Plan, command: list[str] | None = None, name: str = "",
                  tag: str = "") -> list[str]:
    """The command that gets an allocation for `plan` (its account, queue, walltime and resource
    directives), running `command` in it (else a shell)."""
    scheduler = scheduler_for(plan.scheduler, plan.scheduler_commands)
    directives = [word for line in (*plan.queue.directives, *plan.queue.resources)
                  for word in shlex.split(line)]
    return scheduler.allocate_argv(plan.queue.account, plan.queue.walltime_hms, directives, command,
                                   name, tag)


def check_fits(plan: Plan, allocation: Allocation) -> None:
    """Before anything is recorded: the allocation grants each node the CPUs the plan's ranks
    take there (a bare `salloc -N 2` on shared nodes grants one a node, and srun would refuse
    the launch inside the job)."""
    layout = plan.layout
    needed = layout.ranks_per_node * layout.cpus_per_rank
    granted = allocation.cpus_per_node
    if granted is not None and granted < needed:
        raise MmmError(f"{allocation.scheduler} job {allocation.job_id} is invalid for this "
                       f"launch: it grants {granted} CPU{'s' if granted > 1 else ''} on a node "
                       f"({allocation.cpus_said_by}), and the plan runs {layout.ranks_per_node} "
                       f"ranks x {layout.cpus_per_rank} CPU{'s' if layout.cpus_per_rank > 1 else ''}"
                       f" a node; get one that fits with `{allocation_hint(plan)}`")


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
    import subprocess
    import sys

    import psutil

    scheduler = scheduler_for(plan.scheduler, plan.scheduler_commands)
    if not scheduler.allocate_needs_terminal or (sys.stdin.isatty() and sys.stdout.isatty()):
        subprocess.run(argv, check=False)  # (an interrupt kills the command)
        return
    import pty

    sys.stdout.flush()
    try:
        pty.spawn(argv)  # copies the terminal's output to our stdout, and our stdin to it
    except BaseException:
        for child in psutil.Process().children():
            child.kill()
        raise


def allocate(plan: Plan, db_file: Path, argv_for: Callable[[str, str], list[str]],
             run: Callable[[list[str]], None]) -> None:
    """`launch --allocate`'s allocation, a job of its own: recorded before the scheduler is
    asked, asked for by `argv_for(name, tag)` (salloc, qsub -I: the job carries the name and
    tag a batch job does), waited for in the foreground by `run`, then settled by its tag: its
    id once the scheduler shows the job, or no record when the scheduler has none. A SIGTERM,
    SIGHUP or Ctrl-C ends the wait and cancels what was asked for; killed outright, mmm-orch
    leaves the record `submitting` for `status` to find the allocation by its tag, as after an
    interrupted submit (and to end it, or `mmm-orch cancel` it)."""
    scheduler = scheduler_for(plan.scheduler, plan.scheduler_commands)
    tag, local_dir, job_dir = job_dirs(plan, db_file, "", "")
    plan = plan.placed(job_dir, tag, scheduler.directive_path(
        posixpath.join(job_dir, protocol.LOG_FILE)), None)
    argv = argv_for(plan.name, tag)
    values = record_values(plan, "", "", shlex.join(argv))
    db = open_db(str(db_file), create=True)
    assert db is not None
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
    submission = Submission(script=Path(job_dir), workdir=plan.launch.workdir,
                            job_dir=Path(job_dir), log_path=Path(plan.submission.log_path),
                            walltime=plan.queue.walltime, name=plan.name, tag=tag,
                            submitted_at=values["submitted_at"])
    try:
        with signals_as_interrupts():
            run(argv)
    except OSError as exc:  # no salloc or qsub here: nothing was asked for
        forget(db, db.get(job_id, events=False))
        raise MmmError(f"--allocate: cannot run {argv[0]}: {exc.strerror}") from None
    except KeyboardInterrupt:  # (SIGTERM and SIGHUP too)
        found = scheduler.find(submission)
        if found:  # asked for and not wanted any more: nothing of it may stay queued
            db.accepted(job_id, found[0], "allocation interrupted: cancelled")
            cancel(db, db.get(job_id, events=False))
        raise
    found = scheduler.find(submission)
    if found:  # the record's own copy first, as submit writes it (what `db recover` reads)
        copy_keeper(local_dir, {"id": job_id, **values})(found[0])
        db.accepted(job_id, found[0])
    elif found is not None:  # the scheduler answered that it has no such job: it refused
        forget(db, db.get(job_id, events=False))
