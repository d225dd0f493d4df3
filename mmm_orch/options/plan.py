"""The options that make a plan, defined once: what a user may ask of a job (machine, workload,
nodes, queue, the trainer's options, the job's variables, ...), each with its type, default, help,
command-line flags and kind. The command line's flags (cli/common.py) and the Python API's
keywords (api/) are made from these fields, each edge turning what it was given into their types;
the planner's Request (planning/model.py) is these fields and what the use cases add.

Light on purpose: the command line reads it to build its parser at every start."""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any, Literal

from mmm_orch.dataclass_code import dataclass
from mmm_orch.errors import InvalidValue

# What an option's values are, which says how the command line parses them and how the Python
# API checks them: text (None: not given), a node count (None: the workload's), a count from 0,
# a flag, a budget in node-hours, names (repeatable), the trainer's options and the job's
# variables (KEY=VALUE, repeatable), and words (a command).
Kind = Literal[
    "text", "count", "spare", "flag", "budget", "names", "settings", "variables", "words"
]


def asked(
    default: Any,
    help: str,
    *flags: str,
    kind: Kind = "text",
    metavar: str | None = None,
    alone: bool = False,
) -> Any:
    """A plan option: its default, its help, its command-line flags (none: the command line gives
    it otherwise), its kind and the placeholder its help shows; `alone`: only the commands that
    name it take its flag (cli/common.plan_option), not every one that plans."""
    metadata = {"help": help, "flags": flags, "kind": kind, "metavar": metavar, "alone": alone}
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class PlanOptions:
    """What a user asks of a job: the command line's options, the Python API's keywords."""

    machine: str = field(metadata={"help": "machine profile (see `mmm-orch machines`)"})
    workload: str = field(
        metadata={
            "help": "workload spec (see `mmm-orch workloads`); leave it out to run your own "
            "command, given after --"
        }
    )
    nodes: int | None = asked(
        None, "number of nodes (default: the workload's)", "-N", "--nodes", kind="count"
    )
    queue: str | None = asked(
        None, "queue/partition/QOS (default: the first that fits)", "-q", "--queue"
    )
    walltime: str | None = asked(None, "HH:MM:SS (default: the workload's)", "-t", "--walltime")
    account: str | None = asked(None, "project to charge (or $MMM_ORCH_ACCOUNT)", "-A", "--account")
    name: str | None = asked(None, "job name (default: the workload name)", "--name")
    # (name, value) in the order given, a value as typed: text from the command line, a bool,
    # int, float or str from Python; planning reads each as the option's type.
    options: tuple[tuple[str, Any], ...] = asked(
        (), "trainer option (repeatable)", "--set", kind="settings", metavar="KEY=VALUE"
    )
    init_from: str | None = asked(
        None,
        "start from pretrained weights: a Hugging Face model directory or Meta's "
        "(params.json, consolidated.*.pth); checked against the model before the queue",
        "--init-from",
        metavar="PATH",
    )
    profile: str | None = asked(
        None,
        "profile a window of steps: torch (torch.profiler traces; `mmm-orch profile JOB`) "
        "or the machine's profiler (nsys, unitrace, rocprof: `mmm-orch show machine M`)",
        "--profile",
        metavar="TOOL",
    )
    env: tuple[tuple[str, str], ...] = asked(
        (),
        "extra environment variable for the job (repeatable)",
        "--env",
        kind="variables",
        metavar="KEY=VALUE",
    )
    presets: tuple[str, ...] = asked(
        (),
        "enable an environment preset of the machine (repeatable)",
        "--preset",
        kind="names",
        metavar="NAME",
    )
    no_presets: tuple[str, ...] = asked(
        (),
        "disable an environment preset (repeatable)",
        "--no-preset",
        kind="names",
        metavar="NAME",
    )
    stack: str | None = asked(
        None,
        "the machine's software stack (modules) to run on (default: the profile's "
        "default; `mmm-orch show machine M` lists them)",
        "--stack",
        metavar="NAME",
    )
    spare_nodes: int = asked(
        0,
        "ask for K nodes more than --nodes: when a node fails, the job swaps "
        "in a spare and relaunches from the last checkpoint",
        "--spare-nodes",
        kind="spare",
        metavar="K",
    )
    # The command line's text, parsed by planning (cost.parse_budget); a number from Python.
    max_node_hours: float | str | None = asked(
        None,
        "refuse a plan that can be charged more than H node-hours (a sweep: "
        "all its points; a chain: it stops linking before it would pass H)",
        "--max-node-hours",
        kind="budget",
        metavar="H",
    )
    stage_env: bool = asked(
        False,
        "copy the job environment to node-local storage on every node "
        "before the launch (imports then stay off the shared filesystem)",
        "--stage-env",
        kind="flag",
    )
    screen: str | None = asked(
        None,
        "the screen at the start of a job of more than one node, each node's matrix "
        "products before the trainer: stop (a node far below the others and its peak is "
        "left out, a spare takes its place, else the job stops; the profile's default), "
        "warn (named, kept) or off",
        "--screen",
        metavar="stop|warn|off",
    )
    stragglers: str | None = asked(
        None,
        "while a job of more than one node trains: name a rank whose own matrix products "
        "stay far below the others' (name, the default), also save and go on without its "
        "node on a spare (leave, with --spare-nodes), or off",
        "--stragglers",
        metavar="name|leave|off",
    )
    verify: bool = asked(
        False,
        "check the layout before the queue: the trainer's model built and stepped at the "
        "job's world size under fake tensors, on this CPU (needs torch here)",
        "--verify",
        kind="flag",
    )
    workdir: str | None = asked(
        None,
        "the directory the job runs in (default: here; for a job submitted over "
        "SSH, its job directory on the login node)",
        "--workdir",
        metavar="DIR",
        alone=True,
    )
    command: tuple[str, ...] = asked(
        (),
        "your own program, in place of a trainer (the command line's words after --)",
        kind="words",
    )

    def __post_init__(self) -> None:
        for flag, pairs in (("--set", self.options), ("--env", self.env)):
            for key, value in pairs:
                if not key:  # `--set =1`, {"": 1}: the value of nothing
                    raise InvalidValue(flag, f"={value}", "expected KEY=VALUE")


def option_fields() -> tuple[dataclasses.Field, ...]:
    """The plan options a user gives beside the machine and the workload, in the command line's
    order."""
    return dataclasses.fields(PlanOptions)[2:]


def pairs(items: list[str], flag: str) -> tuple[tuple[str, str], ...]:
    """The command line's KEY=VALUE words (`--set`, `--env`) as (key, value) pairs."""
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise InvalidValue(flag, item, "expected KEY=VALUE")
        out.append((key, value))
    return tuple(out)
