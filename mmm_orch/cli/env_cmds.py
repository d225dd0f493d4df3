"""Commands about the job's own Python: env create, env check."""

from __future__ import annotations

import argparse
import shlex
import time


def register(sub) -> None:
    p = sub.add_parser("env", help="the job environment of a machine: a virtual environment with "
                       "mmm-orch on top of its framework module")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, text in (("create", "create or update it where the machine's jobs run (here on a "
                                  "login node, or over SSH), and remember it"),
                       ("check", "run a job's setup lines and activation, and report its "
                                 "interpreter, mmm-orch and torch versions and device")):
        q = actions.add_parser(name, help=text)
        q.add_argument("machine", help="machine profile (see `mmm-orch machines`)")
        q.add_argument("--host", metavar="HOST",
                       help="the login host, as for `submit --host` (default: here when the "
                            "scheduler is on PATH, else the profile's first login host)")
        q.add_argument("-A", "--account", help="project, where the default place uses it")
        if name == "create":
            q.add_argument("--path", metavar="DIR",
                           help="where to make it (an absolute path on the machine; default: "
                                "the one made before, else the profile's place)")
        q.set_defaults(func=cmd_create if name == "create" else cmd_check)


def _where(args: argparse.Namespace):
    """(machine profile, SSH target or '', the environment directory as a shell word)."""
    import dataclasses
    import os

    from mmm_orch.config.registry import load_machine
    from mmm_orch.errors import MmmError
    from mmm_orch.jobs.submit import login_target
    from mmm_orch.planning.checks import check_text
    from mmm_orch.planning.environment import environment_word

    machine = load_machine(args.machine)
    check_text(f"machine {machine.name}: python", machine.python)  # a word of the check's bash
    target = login_target(machine.name, machine.scheduler.kind,
                          dataclasses.asdict(machine.scheduler.commands), machine.login_hosts,
                          args.host)
    path = getattr(args, "path", None)
    if path is not None:
        if not os.path.isabs(check_text("--path", path)):
            raise MmmError(f"--path {path!r} is invalid: give an absolute path on {machine.name}")
        return machine, target, shlex.quote(path)
    account = args.account or os.environ.get("MMM_ORCH_ACCOUNT") or machine.account.default
    word = environment_word(machine, account)
    if not word:
        raise MmmError(f"machine {machine.name} has no job environment (its jobs run "
                       f"`{machine.python}`); give --path DIR to make one")
    return machine, target, word


def _run(target: str, script: str):
    from mmm_orch.hosts import host_for

    return host_for(target).run(["bash", "-lc", script], timeout=900)


def cmd_create(args: argparse.Namespace) -> int:
    import posixpath

    from mmm_orch import envs
    from mmm_orch.errors import MmmError
    from mmm_orch.hosts import host_for
    from mmm_orch.version import __version__

    machine, target, word = _where(args)
    where = f" on {target}" if target else ""
    name, wheel = envs.build_wheel()
    host = host_for(target)
    wheels = posixpath.join(host.home(), ".cache", "mmm-orch", "wheels")
    if host.size(wheels) is None:
        host.make_private_dir(wheels)
    wheel_path = posixpath.join(wheels, name)
    host.write_file(wheel_path, wheel, 0o644)
    print(f"uploaded {name} ({len(wheel) // 1024} KiB) to {wheel_path}{where}")
    result = _run(target, envs.create_script(machine.setup, word, wheel_path))
    for line in result.stdout.splitlines():
        if line.startswith("MMM_ORCH_STEP "):
            print(line.removeprefix("MMM_ORCH_STEP "))
    report = envs.read_report(result.stdout)
    if result.returncode != 0 or report is None or report["mmm_orch"] != __version__:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise MmmError(f"env create {machine.name}{where} failed: {' | '.join(tail) or 'no output'}")
    envs.remember(machine.name, {"path": report["prefix"], "host": target, "version": __version__,
                                 "created": time.strftime("%Y-%m-%d %H:%M:%S")})
    _print_report(machine.name, report, where)
    print(f"jobs on {machine.name} now activate {report['prefix']} (remembered in "
          f"{envs.config_file()})")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from mmm_orch import envs
    from mmm_orch.errors import MmmError
    from mmm_orch.version import __version__

    machine, target, word = _where(args)
    where = f" on {target}" if target else ""
    result = _run(target, envs.check_script(machine.setup, envs.activation(word), machine.python))
    report = envs.read_report(result.stdout)
    if report is None or report["mmm_orch"] != __version__:
        raise MmmError(envs.missing_message(machine.name, report, target,
                                            result.stderr or result.stdout))
    _print_report(machine.name, report, where)
    return 0


def _print_report(machine: str, report: dict, where: str) -> None:
    print(f"job environment of {machine}{where}: {report['prefix']}")
    print(f"  python:   {report['python']}")
    print(f"  mmm-orch: {report['mmm_orch']}")
    print(f"  torch:    {report['torch'] or 'not importable: ' + report.get('torch_error', '')}")
    print(f"  device:   {report['device']} (as this node sees it; compute nodes have the GPUs)")
