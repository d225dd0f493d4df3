"""The bad-input corpus (test_bad_input; test_api says it in the Python API's words): cases
generated from the workload specs (every option, every type, every bound), from the command
line parser (every typed argument of every command) and from the machine profiles (node counts,
queues, walltimes, presets), plus the findings that slipped through before. A case is an id, the
command line, and the fragments its one-line error must hold."""

from __future__ import annotations

import argparse
from pathlib import Path

from helpers import REPO
from mmm_orch.cli import build_parser, common, sweep_cmds
from mmm_orch.config import registry
from mmm_orch.walltime import format_walltime

PROJ = ["-A", "PROJ"]
LOG = str(REPO / "tests" / "fixtures" / "failures" / "perlmutter_cuda_oom_seed003.log")


def _bad_option_values(option) -> list[str]:
    """Values the option's type and bounds refuse."""
    if option.type == "bool":
        return ["maybe", "", "2"]
    if option.type == "choice":
        return ["zzz", ""]
    if option.type == "str":
        return ["two\nlines", "bell\x07"] + (["../up", "a b"] if option.pattern else [])
    values = ["x", "", "1.5" if option.type == "int" else "nan"]
    if option.type == "float":
        values += ["inf", "-inf"]
    for bound, step in ((option.ge, -1), (option.gt, 0), (option.le, 1)):
        if bound is not None:
            values.append(str(int(bound) + step) if option.type == "int" else repr(bound + step))
    return values


def spec_cases() -> list[tuple[str, list[str], list[str]]]:
    """Every bad value of every option of every workload, given with --set."""
    cases = []
    for workload in registry.names("workloads"):
        spec = registry.load_workload(workload)
        for name, option in spec.options.items():
            for value in _bad_option_values(option):
                cases.append((f"--set {workload}.{name}={value!r}",
                              ["aurora", workload, *PROJ, "--set", f"{name}={value}"],
                              [f"option {name}={value!r} is invalid"]))
    return cases


def typed_arguments() -> list[tuple[str, argparse.Action]]:
    """(command words, action) for every argument whose type mmm-orch checks."""
    checked = {common.count, common.lines, common.job_id, common.seconds, common.links,
               sweep_cmds.sweep_id, sweep_cmds.job_or_sweep}
    found = []

    def walk(parser: argparse.ArgumentParser, words: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, words + [name])
            elif action.type in checked:
                found.append((words, action))
    walk(build_parser(), [])
    return found


def parser_cases() -> list[tuple[str, list[str], list[str]]]:
    """Every bad value of every argument whose type mmm-orch checks, in every command."""
    cases = []
    for words, action in typed_arguments():
        positional = not action.option_strings
        name = action.option_strings[-1] if not positional else action.metavar
        prefix = {"render": ["aurora", "fsdp", *PROJ], "submit": ["aurora", "fsdp", *PROJ],
                  "sweep": ["aurora", "fsdp", *PROJ]}.get(words[0], [])
        bad = ["x", "", "-1"]
        if action.type is not common.seconds:
            bad.append("1.5")
        if action.type in (common.count, common.job_id, sweep_cmds.sweep_id, common.links):
            bad.append("0")
        if action.type is common.links:
            bad += ["201", "100000000000000000000", "1e3"]
        if action.type in (common.job_id, sweep_cmds.sweep_id, sweep_cmds.job_or_sweep):
            bad += ["99999999999999999999999", "s0", "s-1", "3\n4"]
        if action.type is common.seconds:
            bad += ["0", "nan", "inf"]
        for value in bad:
            if positional:
                argv = [*words, *prefix, value]
            else:
                argv = [*words, *prefix, f"{name}={value}"]
                if words == ["status"] and name == "--interval":
                    argv.append("--watch")
            cases.append((f"{' '.join(words)} {name}={value!r}", argv, [f"{name} {value!r}"]))
    return cases


def profile_cases() -> list[tuple[str, list[str], list[str]]]:
    """Each packaged profile's bounds overstepped: nodes, presets, queues and their walltimes."""
    cases = []
    for machine in registry.names("machines"):
        profile = registry.load_machine(machine)
        workload = "dist_check"
        cases.append((f"{machine} nodes above max", [machine, workload, *PROJ, "-N",
                                                      str(profile.max_nodes + 1)],
                      [f"--nodes {profile.max_nodes + 1!r}", f"at most {profile.max_nodes}"]))
        cases.append((f"{machine} unknown preset", [machine, workload, *PROJ, "--preset", "nope"],
                      [f"unknown preset on {machine} 'nope'"]))
        cases.append((f"{machine} unknown queue", [machine, workload, *PROJ, "-q", "nope"],
                      ["nope"]))
        for queue in profile.queues:
            if queue.tiers or queue.by_request:
                continue
            over = format_walltime(queue.max_walltime + 3600)
            cases.append((f"{machine} {queue.name} walltime {over}",
                          [machine, workload, *PROJ, "-q", queue.name, "-t", over,
                           "-N", str(queue.min_nodes)],
                          [f"--queue {queue.name!r}", f"at most {format_walltime(queue.max_walltime)}"]))
    return cases


FOUND = [  # the findings this corpus started from, and their neighbours
    ("env name with a space", ["render", "aurora", "fsdp", *PROJ, "--env", "FOO =x"], ["--env 'FOO '"]),
    ("env without a name", ["render", "aurora", "fsdp", *PROJ, "--env", "=x"], ["--env '=x'"]),
    ("env without =", ["render", "aurora", "fsdp", *PROJ, "--env", "FOO"], ["--env 'FOO'"]),
    ("env name with a dash", ["render", "aurora", "fsdp", *PROJ, "--env", "A-B=1"], ["--env 'A-B'"]),
    ("env value with a newline", ["render", "aurora", "fsdp", *PROJ, "--env", "A=1\nrm -rf ~"],
     ["--env A", "'\\n'"]),
    ("set value with a newline", ["render", "aurora", "fsdp", *PROJ, "--set", "data_dir=/x\nrm"],
     ["option data_dir='/x\\nrm' is invalid", "no control characters"]),
    ("huge node count", ["render", "aurora", "fsdp", *PROJ, "-N", "99999999999999999999999"],
     ["--nodes 99999999999999999999999 is invalid"]),
    ("empty name", ["render", "aurora", "fsdp", *PROJ, "--name", ""], ["--name ''"]),
    ("name of spaces", ["render", "aurora", "fsdp", *PROJ, "--name", "   "], ["--name '   '"]),
    ("name too long", ["render", "aurora", "fsdp", *PROJ, "--name", "x" * 64], ["--name 'xxxx"]),
    ("status of a machine typo", ["status", "--machine", "auroa"],
     ["unknown machine 'auroa'", "did you mean aurora"]),
    ("startup of a machine typo", ["startup", "--machine", "polars"], ["unknown machine 'polars'"]),
    ("logs --tail -5", ["logs", "1", "--tail", "-5"], ["--tail '-5'"]),
    ("status -N two", ["render", "aurora", "fsdp", *PROJ, "-N", "two"], ["--nodes 'two'"]),
    ("huge job id", ["status", "99999999999999999999"], ["JOB '99999999999999999999'"]),
    ("job 999 on a fresh machine", ["status", "999"], ["job 999 not found", "no jobs recorded yet"]),
    ("logs of a job on a fresh machine", ["logs", "3"], ["job 3 not found"]),
    ("show of a job on a fresh machine", ["show", "3"], ["job 3 not found"]),
    ("show of a huge job", ["show", "99999999999999999999"], ["'99999999999999999999' is invalid"]),
    ("cancel on a fresh machine", ["cancel", "1"], ["job 1 not found"]),
    ("timeline on a fresh machine", ["timeline", "1"], ["job 1 not found"]),
    ("walltime of zero", ["render", "aurora", "fsdp", *PROJ, "-t", "00:00:00"], ["--walltime", "00:00:00"]),
    ("walltime with 61 minutes", ["render", "aurora", "fsdp", *PROJ, "-t", "01:61:00"], ["'01:61:00' is malformed"]),
    ("empty walltime", ["render", "aurora", "fsdp", *PROJ, "-t", ""], ["'' is malformed"]),
    ("account with a newline", ["render", "aurora", "fsdp", "-A", "P\nQ"], ["--account 'P\\nQ'"]),
    ("empty account", ["render", "aurora", "fsdp", "-A", ""], ["--account is required"]),
    ("workdir that does not exist", ["submit", "local", "fsdp", "--workdir", "/nonexistent/dir"],
     ["--workdir '/nonexistent/dir' is invalid", "no such directory"]),
    ("empty workdir", ["submit", "local", "fsdp", "--workdir", ""], ["--workdir '' is invalid"]),
    ("workdir with a newline", ["submit", "local", "fsdp", "--workdir", "/tmp/a\nb"], ["--workdir", "'\\n'"]),
    ("out is a directory", ["render", "aurora", "fsdp", *PROJ, "--out", "/tmp"], ["--out '/tmp'"]),
    ("out in a missing directory", ["render", "aurora", "fsdp", *PROJ, "--out", "/nonexistent/x.sh"],
     ["--out '/nonexistent/x.sh'", "cannot write"]),
    ("host on a local machine", ["submit", "local", "fsdp", "--host", "login"], ["--host 'login'"]),
    ("diagnose with neither", ["diagnose"], ["give a job id or --log FILE"]),
    ("diagnose of a missing log", ["diagnose", "--log", "/nonexistent.log"], ["--log '/nonexistent.log'"]),
    ("startup of a missing log", ["startup", "--log", "/nonexistent.log"], ["--log '/nonexistent.log'"]),
    ("unknown command", ["sumbit"], ["invalid choice: 'sumbit'"]),
    ("unknown schema kind", ["schema", "machines"], ["invalid choice: 'machines'"]),
    ("render without a workload", ["render", "aurora"], ["workload is missing", "after --"]),
    ("nothing after --", ["submit", "local", "--"], ["command after -- is missing"]),
    ("a trainer and a command", ["submit", "local", "fsdp", "--", "python3", "x.py"],
     ["command after --", "runs its trainer"]),
    ("a command after status", ["status", "--", "ls"], ["mmm-orch status", "nothing may follow --"]),
    ("a command word on two lines", ["submit", "local", "--", "python3", "-c", "print(1)\nrm x"],
     ["command word 3", "one line"]),
    ("the command workload without a command", ["submit", "local", "command"],
     ["workload 'command'", "give it after --"]),
] + [(f"secret-looking env {name}", ["render", "aurora", "fsdp", *PROJ, "--env", f"{name}=s3cr3t"],
      [f"--env {name}", "refusing to write a secret"])
     for name in ("WANDB_KEY", "AWS_ACCESS_KEY_ID", "GH_PAT", "HF_TOKEN", "OPENAI_API_KEY",
                  "DB_PASSWORD", "GITHUB_AUTH", "MY_SECRET", "SSH_PRIVATE_KEY", "SESSION_COOKIE")]


def command_cases() -> list[tuple[str, list[str], list[str]]]:
    """The commands added since the corpus began (sweep, report, plot, nodes, env, db, rerun,
    chains): each value they take, spelled wrong in every way the corpus knows."""
    cases = []
    for value in ("two\nlines", "bell\x07", "", "   "):
        cases += [
            (f"env create --account {value!r}", ["env", "create", "aurora", "-A", value],
             ["--account"]),
            (f"env check --account {value!r}", ["env", "check", "aurora", "-A", value],
             ["--account"]),
            (f"nodes forget {value!r}", ["nodes", "forget", value], ["node"]),
            (f"diagnose --machine {value!r}", ["diagnose", "--log", LOG, "-m", value],
             ["machine"]),
            (f"startup --workload {value!r}", ["startup", "--workload", value], ["workload"]),
        ]
    for command in ("status", "nodes", "startup"):
        cases.append((f"{command} --machine typo", [command, "--machine", "auroa"],
                      ["unknown machine 'auroa'"]))
    for words in (["env", "create"], ["env", "check"]):
        cases.append((f"{' '.join(words)} of a machine typo", [*words, "polars"],
                      ["unknown machine 'polars'"]))
        cases.append((f"{' '.join(words)} --host on local", [*words, "local", "--host", "login"],
                      ["--host 'login'"]))
    cases += [
        ("env create --path with a newline", ["env", "create", "aurora", *PROJ, "--path", "/a\nb"],
         ["--path", "'\\n'"]),
        ("env create --path relative", ["env", "create", "aurora", *PROJ, "--path", "envs/x"],
         ["--path 'envs/x'"]),
        ("rerun on a fresh machine", ["rerun", "1"], ["job 1 not found"]),
        ("report of a sweep on a fresh machine", ["report", "s1"], ["sweep 1 not found"]),
        ("plot on a fresh machine", ["plot", "1"], ["job 1 not found"]),
        ("sweep nodes not a number", ["sweep", "local", "fsdp", "--nodes", "1,x"], ["--nodes"]),
        ("sweep nodes empty item", ["sweep", "local", "fsdp", "--nodes", "1,,2"], ["--nodes"]),
        ("sweep set without a value", ["sweep", "local", "fsdp", "--set", "lr="], ["lr"]),
        ("sweep set of an unknown option", ["sweep", "local", "fsdp", "--set", "nope=1,2"],
         ["nope"]),
        ("chain of a huge count", ["submit", "local", "fsdp", "--chain", "100000000000000000000"],
         ["--chain"]),
        ("chain of zero", ["submit", "local", "fsdp", "--chain", "0"], ["--chain '0'"]),
        ("db backup of a directory", ["--db", "/tmp", "db", "backup"], ["/tmp"]),
        ("db check of a directory", ["--db", "/tmp", "db", "check"], ["/tmp"]),
    ]
    return cases


CASES = ([(i, ["render", *a], f) for i, a, f in spec_cases()]
         + [(i, ["submit", *a], f) for i, a, f in spec_cases()[::7]]  # the same refusals at submit
         + [(i, ["sweep", *a], [f[0].split("=")[0].removeprefix("option ")])  # ...and in a grid
            for i, a, f in spec_cases()[3::7]]
         + command_cases()
         + parser_cases()
         + [(i, ["render", *a], f) for i, a, f in profile_cases()]
         + FOUND)


def files_under(root: Path, skip: Path) -> set[str]:
    """Every path under `root`, relative to it, but `skip` and what it holds: compared before and
    after a refusal, nothing written."""
    return {str(p.relative_to(root)) for p in root.rglob("*") if skip not in p.parents and p != skip}
