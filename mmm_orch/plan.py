"""Resolve a request (machine, workload, CLI options) into one validated, immutable plan.

Data flows one way: Request -> Plan -> script -> submission -> record. A Plan holds every
decision (queue, layout, environment, launch line) so the script template only formats it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any

from mmm_orch import __version__
from mmm_orch.config.common import ENV_NAME, NODE_NAME, check_placeholders
from mmm_orch.config.machine import Machine, Queue
from mmm_orch.config.registry import load_machine, load_workload, unknown_name
from mmm_orch.config.workload import Workload
from mmm_orch.errors import MmmError
from mmm_orch.injob.protocol import LOG_FILE, MODULES, NODES_TOKEN
from mmm_orch.walltime import format_walltime, parse_walltime

# Account, queue and job names reach scheduler directives, which are not shell-quoted.
_SAFE_WORD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,62}$")
_JOB_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,62}$")
# Trainer options that define the parallel mesh; always passed explicitly to the trainer.
LAYOUT_OPTIONS = ("tp", "pp")
# Scripts, logs and the job database are readable: secrets never go into them. A name is
# refused when it contains one of these, or when one of its _-separated words is a secret word.
_SECRET = re.compile(r"(TOKEN|SECRET|PASSW|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL)", re.I)
_SECRET_WORDS = {"KEY", "KEYS", "PAT", "PASS", "PWD", "AUTH", "COOKIE", "SESSION", "SIGNATURE"}
_NOT_SECRET = {"PWD", "OLDPWD"}  # the shell's working directories


def looks_secret(name: str) -> bool:
    words = set(name.upper().split("_"))
    return name.upper() not in _NOT_SECRET and bool(_SECRET.search(name) or words & _SECRET_WORDS)


def check_text(field: str, value: str) -> str:
    """One line of text: no control characters, nothing that is not valid Unicode (such a value
    cannot be written into the UTF-8 job script, or reach the job intact)."""
    bad = sorted({c for c in value if ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) <= 0xDFFF})
    if bad:
        shown = ", ".join(repr(c) if not 0xD800 <= ord(c) <= 0xDFFF else "a byte that is not UTF-8"
                          for c in bad)
        raise MmmError(f"{field} {value!r} is invalid: it contains {shown}; values are one line "
                       "of text")
    return value


@dataclass(frozen=True)
class Request:
    """What the user asked for, as typed."""

    machine: str
    workload: str
    nodes: int | None = None
    queue: str | None = None
    walltime: str | None = None
    account: str | None = None
    name: str | None = None
    sets: tuple[str, ...] = ()
    envs: tuple[str, ...] = ()
    presets: tuple[str, ...] = ()
    no_presets: tuple[str, ...] = ()
    workdir: str | None = None
    stage_env: bool = False  # copy the job environment to node-local storage before the launch
    spare_nodes: int = 0     # nodes asked for beyond --nodes, swapped in when one fails
    avoid_nodes: tuple[str, ...] = ()  # nodes known to be bad on this machine (mmm-orch nodes)


@dataclass(frozen=True)
class EnvEntry:
    name: str
    value: str
    # literal: a user value, single-quoted; otherwise a profile value in double quotes ($VARS expand)
    literal: bool = False
    source: str = ""


@dataclass(frozen=True)
class EnvGroup:
    name: str
    description: str = ""
    source: str = ""
    set: tuple[EnvEntry, ...] = ()
    unset: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan:
    """Every decision about one job; built only by resolve() from validated inputs."""

    mmm_orch_version: str
    machine: str
    facility: str
    scheduler: str
    scheduler_commands: dict[str, str] = field(hash=False)
    workload: str
    trainer: str
    name: str
    nodes: int
    ranks_per_node: int
    ranks: int
    gpus_per_node: int
    cpus_per_rank: int
    mesh: dict[str, int] = field(hash=False)
    queue: str | None
    queue_tier: str | None
    queue_reason: str
    queue_directives: tuple[str, ...]
    walltime: int
    account: str | None
    directives: tuple[str, ...]
    submit_dir_var: str
    workdir: str
    setup: tuple[str, ...]
    env: tuple[EnvGroup, ...]
    launcher: tuple[str, ...]
    # Where the launch runs: `hosts` by default; with spare nodes, the failover loop puts
    # `on_nodes` for the active nodes in place of NODES_TOKEN (injob/failover.py).
    hosts: str
    on_nodes: str
    spare_nodes: int
    avoid_nodes: tuple[str, ...]
    node_list: str  # the profile's command listing the job's nodes ("" = the scheduler's)
    host_addr: str  # a node's address from its name ({node}, {short}): rank 0's after failover
    exclude_directive: str  # keeps the known-bad nodes out of the allocation ("" = none)
    failover_directives: tuple[str, ...]  # with spare nodes: a lost node does not end the job
    python_prefix: bool  # mpiexec/srun start `python -m trainer`; torchrun takes `-m trainer`
    trainer_args: dict[str, Any] = field(hash=False)
    trainer_options: tuple[str, ...]  # what the workload's trainer accepts
    device: str
    torch_device: str
    backend: str
    device_index: tuple[int, ...]
    physical_devices: tuple[int | None, ...]
    python: str
    python_is_submitters: bool  # python: auto, the interpreter running mmm-orch
    # The job environment's directory as a shell word ('' when the machine has none): activated
    # after the setup lines, or copied to `stage_dir` on every node first (`per_node`).
    environment: str
    stage_env: bool
    stage_dir: str
    per_node: str
    watchdog_first_step: int  # seconds; 0 = no watchdog
    watchdog_step: int
    walltime_margin: int  # seconds before the walltime the trainers are asked to save and stop
    stop_signal: str  # what the launcher passes on to the trainers (USR1, TERM)
    login_hosts: tuple[str, ...]
    remote_jobs_dir: str
    workdir_given: bool  # False: a remote submission runs in its job directory instead
    # Set by placed() at submission: where the job's files are and how the scheduler tags it.
    log_path: str | None = None
    log_directive: str = ""  # the log path as the scheduler's directive syntax needs it
    job_dir: str = ""
    tag: str = ""
    # A link of a chain (jobs/chains.py): its state file, its place, and the job it waits for.
    chain_file: str = ""
    chain_link: int = 0
    chain_links: int = 0
    depends_on: str = ""

    @property
    def walltime_hms(self) -> str:
        return format_walltime(self.walltime)

    @property
    def program(self) -> tuple[str, ...]:
        prefix = [self.python] if self.python_prefix else []
        return (*prefix, "-m", self.trainer, *_argv(self.trainer_args))

    @property
    def stops_before_walltime(self) -> bool:
        """The watchdog asks the trainer to save and stop before the walltime: only a trainer
        that can resume (the stop signal would merely kill any other program early)."""
        return bool(self.watchdog_step) and "resume" in self.trainer_options

    @property
    def failover(self) -> bool:
        """The launch runs under mmm_orch.injob.failover (it has spare nodes to swap in)."""
        return self.spare_nodes > 0

    @property
    def launch_line(self) -> str:
        """Launcher tokens come from the profile (trusted, may hold $VARS); argv is quoted. With
        failover, NODES_TOKEN marks where the active nodes go."""
        hosts = NODES_TOKEN if self.failover else self.hosts
        return " ".join([self.launcher[0], *([hosts] if hosts else []), *self.launcher[1:],
                         *(shlex.quote(a) for a in self.program)])

    @property
    def run_dir(self) -> str:
        """Where the trainer writes metrics and checkpoints ('' for trainers without one)."""
        name = self.trainer_args.get("run_name")
        if not name or "output_dir" not in self.trainer_options:
            return ""
        return os.path.join(self.workdir, str(self.trainer_args.get("output_dir", "outputs")), name)

    def placed(self, job_dir: str, tag: str, log_directive: str,
               workdir: str | None = None) -> Plan:
        """The plan of a submission: its job directory and log (and, for a remote job, the
        directory it runs in there), its tag, and a run directory of its own unless the user
        named one (so that no two runs share metrics or checkpoints by accident)."""
        args = dict(self.trainer_args)
        if "run_name" in self.trainer_options and not args.get("run_name"):
            args["run_name"] = f"{self.name}-{tag}"
        return dataclasses.replace(
            self, log_path=f"{job_dir}/{LOG_FILE}", log_directive=log_directive, job_dir=job_dir,
            tag=tag, workdir=workdir or self.workdir, trainer_args=args)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "program": list(self.program),
                "launch_line": self.launch_line, "run_dir": self.run_dir}


def _fail(field: str, value: Any, allowed: str) -> MmmError:
    return MmmError(f"{field} {value!r} is invalid: {allowed}")


def _pairs(items: tuple[str, ...], flag: str) -> list[tuple[str, str]]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise _fail(flag, item, "expected KEY=VALUE")
        out.append((key, value))
    return out


def _pick_queue(machine: Machine, request: Request, nodes: int, walltime: int):
    """(queue, tier name, reason) for the request, or an error that names the limits."""
    if not machine.queues:
        if request.queue:
            raise _fail("--queue", request.queue, f"{machine.name} has no queues")
        return None, None, "no scheduler queue on this machine"

    def fit(queue: Queue) -> tuple[bool, str | None, str]:
        if not queue.min_nodes <= nodes <= queue.max_nodes:
            return False, None, f"takes {queue.min_nodes}-{queue.max_nodes} nodes"
        if queue.tiers:
            tier = next((t for t in queue.tiers if t.min_nodes <= nodes <= t.max_nodes), None)
            if tier is None:
                return False, None, "no tier for this node count"
            if walltime > tier.max_walltime:
                label = f"tier {tier.name}" if tier.name else f"{tier.min_nodes}-{tier.max_nodes} nodes"
                return False, tier.name or None, (
                    f"allows at most {format_walltime(tier.max_walltime)} for {label}")
            return True, tier.name or None, ""
        if walltime > queue.max_walltime:
            return False, None, f"allows at most {format_walltime(queue.max_walltime)}"
        return True, None, ""

    if request.queue:
        queue = machine.queue(request.queue)
        if queue is None:
            raise unknown_name(f"queue on {machine.name}", request.queue,
                               [q.name for q in machine.queues])
        ok, tier, why = fit(queue)
        if not ok:
            raise MmmError(
                f"--queue {queue.name!r} cannot run {nodes} nodes for {format_walltime(walltime)}: "
                f"it {why} ({queue.limits()})")
        return queue, tier, "requested"
    tried = []
    for queue in machine.queues:
        if not queue.automatic or queue.by_request:
            continue
        ok, tier, why = fit(queue)
        if ok:
            return queue, tier, "first queue that fits nodes and walltime"
        tried.append(f"{queue.name} ({queue.limits()})")
    raise MmmError(
        f"no queue on {machine.name} fits {nodes} nodes for {format_walltime(walltime)}; "
        f"automatic queues: {'; '.join(tried)}. Change --nodes/--walltime or name a --queue")


def _trainer_args(workload: Workload, machine_args: dict[str, Any], sets) -> dict[str, Any]:
    args: dict[str, Any] = {
        key: workload.options[key].coerce(key, workload.options[key].default)
        for key in LAYOUT_OPTIONS
        if key in workload.options and workload.options[key].default is not None
    }
    for source in (workload.args, machine_args):
        for key, value in source.items():
            args[key] = workload.options[key].coerce(key, value)
    for key, value in sets:
        option = workload.options.get(key)
        if option is None:
            raise unknown_name(f"--set key for workload {workload.name}", key,
                               sorted(workload.options))
        try:
            args[key] = option.coerce(key, value)
        except ValueError as exc:
            raise MmmError(f"--set {exc}") from None
    return args


def _argv(args: dict[str, Any]) -> list[str]:
    argv: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + key.replace("_", "-"))
        else:
            argv += [flag, str(value)]
    return argv


def _env_groups(machine: Machine, workload: Workload, request: Request, nodes: int,
                override_presets: list[str], override_no_presets: list[str],
                device_env: list[EnvEntry], workload_env: dict[str, str]) -> list[EnvGroup]:
    for name in (*request.presets, *request.no_presets, *override_presets, *override_no_presets):
        if machine.preset(name) is None:
            raise unknown_name(f"preset on {machine.name}", name, [p.name for p in machine.presets])
    wanted = {p.name for p in machine.presets if p.default}
    wanted |= set(override_presets)
    wanted -= set(override_no_presets)
    wanted |= set(request.presets)
    wanted -= set(request.no_presets)

    groups: list[EnvGroup] = []
    owner: dict[str, tuple[str, str]] = {}
    for preset in machine.presets:
        if preset.name not in wanted or not preset.applies_to(nodes):
            continue
        entries = []
        for var, spec in preset.set.items():
            value, source = (spec, "") if isinstance(spec, str) else (spec.value, spec.source)
            if var in owner and owner[var][1] != value:
                raise MmmError(
                    f"presets {owner[var][0]!r} and {preset.name!r} set {var} to "
                    f"{owner[var][1]!r} and {value!r}: disable one with --no-preset")
            owner[var] = (preset.name, value)
            entries.append(EnvEntry(name=var, value=value, source=source))
        groups.append(EnvGroup(name=f"preset {preset.name}", description=preset.description,
                               source=preset.source, set=tuple(entries),
                               unset=tuple(preset.unset)))
    groups.append(EnvGroup(name="device and rendezvous", description="read by mmm_orch.runtime",
                           source=machine.devices.source or machine.rendezvous.source,
                           set=tuple(device_env)))
    if workload_env:
        groups.append(EnvGroup(
            name=f"workload {workload.name}",
            set=tuple(EnvEntry(name=k, value=v) for k, v in workload_env.items())))
    user = []
    for key, value in _pairs(request.envs, "--env"):
        check_text(f"--env {key}", value)
        if not ENV_NAME.fullmatch(key):  # match() would pass a name ending in a newline
            raise _fail("--env", key, "names are letters, digits and _, not starting with a digit")
        if looks_secret(key):
            raise MmmError(
                f"--env {key}: refusing to write a secret into the job script, its log and the job "
                f"database; set it in your shell startup file on {machine.name} instead")
        user.append(EnvEntry(name=key, value=value, literal=True))
    if user:
        groups.append(EnvGroup(name="user --env", set=tuple(user)))
    return groups


def _check_script_text(machine: Machine, workload: Workload) -> None:
    """Profile and spec fields the script carries outside the setup lines (comments, directives,
    shell names, double-quoted values). A user's own YAML is data: a line break in a comment or a
    directive would start a shell line of its own, a name must be a name."""
    where = f"machine {machine.name}"
    texts = [("machine name", machine.name), ("workload name", workload.name),  # names first
             (f"{where}: python", machine.python),
             (f"{where}: launcher.cpu_bind", machine.launcher.cpu_bind),
             (f"{where}: facility", machine.facility),
             (f"{where}: scheduler.queue_directive", machine.scheduler.queue_directive),
             (f"{where}: scheduler.exclude_directive", machine.scheduler.exclude_directive),
             (f"{where}: devices.source", machine.devices.source),
             (f"{where}: rendezvous.source", machine.rendezvous.source)]
    texts += [(f"{where}: directive", d) for d in machine.directives]
    texts += [(f"{where}: scheduler.failover_directives", d)
              for d in machine.scheduler.failover_directives]
    for queue in machine.queues:
        texts.append((f"{where}: queue name", queue.name))
        texts += [(f"{where}: queue {queue.name} tier name", t.name) for t in queue.tiers]
        texts += [(f"{where}: queue {queue.name} directive", d) for d in queue.directives or ()]
    for preset in machine.presets:
        texts += [(f"{where}: preset name", preset.name),
                  (f"{where}: preset {preset.name} description", preset.description),
                  (f"{where}: preset {preset.name} source", preset.source)]
        texts += [(f"{where}: preset {preset.name} {var} source", spec.source)
                  for var, spec in preset.set.items() if not isinstance(spec, str)]
    for field_name, text in texts:
        check_text(field_name, text)
    scheduler = machine.scheduler
    templates = [(f"{where}: scheduler.queue_directive", scheduler.queue_directive, "queue"),
                 (f"{where}: scheduler.exclude_directive", scheduler.exclude_directive, "nodes")]
    templates += [(f"{where}: queue {q.name} directive", d, "queue")
                  for q in machine.queues for d in q.directives or ()]
    for field_name, template, placeholder in templates:
        try:
            check_placeholders(template, (placeholder,))
        except ValueError as exc:
            raise MmmError(f"{field_name}: {exc}") from None
    names = [(f"{where}: scheduler.submit_dir_var", machine.scheduler.submit_dir_var),
             (f"{where}: devices.visible_env", machine.devices.visible_env)]
    for preset in machine.presets:
        names += [(f"{where}: preset {preset.name} variable", n)
                  for n in (*preset.set, *preset.unset)]
    names += [(f"workload {workload.name}: env variable", n) for n in workload.env]
    names += [(f"workload {workload.name}: machines.{m}.env variable", n)
              for m, override in workload.machines.items() for n in override.env]
    for field_name, name in names:
        if name and not ENV_NAME.fullmatch(name):
            raise _fail(field_name, name, "an environment variable name: letters, digits and _, "
                        "not starting with a digit")
    # Written in double quotes so that $VARS expand, as a profile's preset values are.
    envs = [(f"workload {workload.name}: env {k}", v) for k, v in workload.env.items()]
    envs += [(f"workload {workload.name}: machines.{m}.env {k}", v)
             for m, override in workload.machines.items() for k, v in override.env.items()]
    for field_name, value in envs:
        if '"' in check_text(field_name, value) or "`" in value:
            raise _fail(field_name, value, "a workload's env value may not contain \" or ` "
                        "(it is written in double quotes, where $VARS expand)")


def _workdir(given: str | None) -> str:
    """The directory the job runs in: --workdir (checked where the job runs, at submission), else
    the current directory."""
    if given is not None:
        if not given:
            raise _fail("--workdir", given, "name a directory")
        return os.path.abspath(check_text("--workdir", given))
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise MmmError("the current directory no longer exists: cd to one that does, or give "
                       "--workdir") from None


def environment_word(machine: Machine, account: str | None) -> str:
    """The job environment's directory as a shell word: the one `env create` made for this
    machine, else the profile's default place; '' for machines without one."""
    from mmm_orch import envs

    if entry := envs.remembered(machine.name):
        path = entry["path"]
        if not isinstance(path, str) or not os.path.isabs(check_text("environment path", path)):
            raise MmmError(f"{envs.config_file()}: the environment of {machine.name} {path!r} is "
                           f"invalid: an absolute path; run `mmm-orch env create {machine.name}`")
        return shlex.quote(path)
    if machine.environment is None:
        return ""
    # The word is double-quoted so that $USER expands: the account must be a plain word (env
    # create and env check reach here without resolve()'s own check).
    if account and not _SAFE_WORD.match(account):
        raise _fail("--account", account, "use letters, digits, '_', '.', '+', '-'")
    template = machine.environment.path
    try:
        check_placeholders(template, ("account", "account_lower"))
    except ValueError as exc:
        raise MmmError(f"machine {machine.name}: environment.path: {exc}") from None
    if ("{account" in template) and not account:
        raise MmmError(f"--account is needed on {machine.name}: the job environment lives under "
                       f"the project ({template})")
    path = template.format(account=account or "", account_lower=(account or "").lower())
    return f'"{path}"'  # a profile value: $USER and friends expand where it is used


def resolve(request: Request) -> Plan:
    """The plan for `request`, or MmmError naming the field, the value and what is allowed."""
    machine = load_machine(request.machine)
    workload = load_workload(request.workload)
    _check_script_text(machine, workload)
    override = workload.machines.get(machine.name)

    nodes = request.nodes
    if nodes is None:
        nodes = (override and override.nodes) or min(workload.defaults.nodes, machine.max_nodes)
    if nodes < 1:
        raise _fail("--nodes", nodes, "must be at least 1")
    if nodes > machine.max_nodes:
        raise _fail("--nodes", nodes, f"{machine.name} has at most {machine.max_nodes} nodes")

    if request.walltime is not None:
        try:
            walltime = parse_walltime(request.walltime)
        except ValueError as exc:
            raise MmmError(f"--walltime: {exc}") from None
    else:
        walltime = (override and override.walltime) or workload.defaults.walltime
    if machine.min_walltime and walltime < machine.min_walltime:
        raise _fail("--walltime", format_walltime(walltime),
                    f"{machine.name} needs at least {format_walltime(machine.min_walltime)}")

    if workload.resources.accelerator and machine.node.gpus == 0:
        raise MmmError(
            f"workload {workload.name} needs an accelerator and {machine.name} has none "
            f"(device {machine.node.device})")
    need = workload.resources.min_gpu_memory_gib
    have = machine.node.gpu_memory_gib
    if need and have and have < need:
        raise MmmError(f"workload {workload.name} needs {need} GiB per device; "
                       f"{machine.name} has {have} GiB")

    spare = request.spare_nodes
    if spare < 0:
        raise _fail("--spare-nodes", spare, "0 or more")
    if spare and not machine.launcher.on_nodes:
        raise _fail("--spare-nodes", spare, f"{machine.name}'s launcher cannot run on some of the "
                    "job's nodes (its profile has no launcher.on_nodes)")
    if nodes + spare > machine.max_nodes:
        raise _fail("--spare-nodes", spare, f"{nodes} + {spare} nodes: {machine.name} has at "
                    f"most {machine.max_nodes}")
    allocated = nodes + spare

    for node in request.avoid_nodes:  # from the database; they reach directives
        if not NODE_NAME.match(node):
            raise _fail("bad node", node, "a host name; `mmm-orch nodes forget NODE` drops it")
    exclude = machine.scheduler.exclude_directive
    if exclude and request.avoid_nodes and allocated > machine.max_nodes - len(request.avoid_nodes):
        raise _fail("--nodes", nodes, f"{allocated} nodes with the spares: {machine.name} has "
                    f"{machine.max_nodes}, less the known-bad {', '.join(request.avoid_nodes)} "
                    f"(`mmm-orch nodes forget NODE` to use one again)")
    queue, tier, reason = _pick_queue(machine, request, allocated, walltime)

    account = request.account or os.environ.get("MMM_ORCH_ACCOUNT") or machine.account.default or None
    if machine.account.required and not account:
        raise MmmError(f"--account is required on {machine.name} (or set MMM_ORCH_ACCOUNT)")
    if account and not _SAFE_WORD.match(account):
        raise _fail("--account", account, "use letters, digits, '_', '.', '+', '-'")

    name = workload.name if request.name is None else request.name
    if not _JOB_NAME.match(name):
        raise _fail("--name", name, "start with a letter; letters, digits, '_', '.', '-'; at most 63")

    args = _trainer_args(workload, override.args if override else {}, _pairs(request.sets, "--set"))
    ranks_per_node = machine.default_ranks_per_node
    ranks = nodes * ranks_per_node
    tp = workload.layout_value("tp", args)
    pp = workload.layout_value("pp", args)
    if tp < 1 or ranks_per_node % tp:
        raise _fail("tp", tp, f"must divide the {ranks_per_node} ranks per node on {machine.name} "
                    "(tensor-parallel groups stay inside a node)")
    if pp < 1 or ranks % (tp * pp):
        raise _fail("pp", pp, f"tp x pp = {tp * pp} must divide the {ranks} ranks")
    mesh = {"dp": ranks // (tp * pp), "tp": tp, "pp": pp}

    gpus = machine.node.gpus
    cpus_per_rank = max(1, machine.node.usable_cores * machine.node.threads_per_core // ranks_per_node)
    python = sys.executable if machine.python == "auto" else machine.python
    # {cpu_bind} and {python} go into launcher lines: shell words, like the values around them.
    cpu_bind = machine.launcher.cpu_bind
    fields = {"nodes": nodes, "ranks": ranks, "ranks_per_node": ranks_per_node,
              "gpus_per_node": gpus, "cpus_per_rank": cpus_per_rank,
              "cpu_bind": shlex.quote(cpu_bind) if cpu_bind else "", "python": shlex.quote(python)}
    launcher = [machine.launcher.command.format(**fields)]
    launcher += [arg.format(**fields) for arg in machine.launcher.args]

    torch_device = "cuda" if machine.node.device == "rocm" else machine.node.device
    device_env = [EnvEntry(name="MMM_DEVICE", value=torch_device),
                  EnvEntry(name="MMM_BACKEND", value=machine.backend)]
    if machine.devices.visible:
        device_env.append(EnvEntry(name=machine.devices.visible_env,
                                   value=",".join(map(str, machine.devices.visible))))
    if machine.devices.one_per_rank:
        device_env.append(EnvEntry(name="MMM_DEVICE_PER_RANK", value="1"))
    if machine.rendezvous.master_addr:
        device_env.append(EnvEntry(name="MASTER_ADDR", value=machine.rendezvous.master_addr))
    if machine.rendezvous.master_port == "auto":  # a port nobody on the node holds
        device_env.append(EnvEntry(name="MASTER_PORT", value=f"$({shlex.quote(python)} -m "
                                                             f"{MODULES['rendezvous']})"))
    elif machine.rendezvous.master_port:
        device_env.append(EnvEntry(name="MASTER_PORT", value=machine.rendezvous.master_port))

    workload_env = dict(workload.env)
    if override:
        workload_env.update(override.env)
    env = _env_groups(machine, workload, request, nodes,
                      list(override.presets) if override else [],
                      list(override.no_presets) if override else [],
                      device_env, workload_env)

    environment = environment_word(machine, account)
    if request.stage_env and not environment:
        raise _fail("--stage-env", True, f"{machine.name} has no job environment to stage (the "
                    "jobs run the interpreter that submitted them)")

    queue_directives: tuple[str, ...] = ()
    if queue is not None:
        templates = queue.directives if queue.directives is not None else [machine.scheduler.queue_directive]
        queue_directives = tuple(t.format(queue=queue.name) for t in templates if t)

    return Plan(
        mmm_orch_version=__version__,
        machine=machine.name,
        facility=machine.facility,
        scheduler=machine.scheduler.kind,
        scheduler_commands=dataclasses.asdict(machine.scheduler.commands),
        workload=workload.name,
        trainer=workload.trainer,
        name=name,
        nodes=nodes,
        ranks_per_node=ranks_per_node,
        ranks=ranks,
        gpus_per_node=gpus,
        cpus_per_rank=cpus_per_rank,
        mesh=mesh,
        queue=queue.name if queue else None,
        queue_tier=tier,
        queue_reason=reason,
        queue_directives=queue_directives,
        walltime=walltime,
        account=account,
        directives=tuple(d.format(**{**fields, "nodes": allocated}) for d in machine.directives),
        submit_dir_var=machine.scheduler.submit_dir_var,
        workdir=_workdir(request.workdir),
        setup=tuple(machine.setup),
        env=tuple(env),
        launcher=tuple(launcher),
        hosts=machine.launcher.hosts,
        on_nodes=machine.launcher.on_nodes,
        spare_nodes=spare,
        avoid_nodes=tuple(request.avoid_nodes),
        node_list=machine.scheduler.node_list,
        host_addr=machine.rendezvous.host_addr,
        exclude_directive=(exclude.format(nodes=",".join(request.avoid_nodes))
                           if exclude and request.avoid_nodes else ""),
        failover_directives=tuple(machine.scheduler.failover_directives) if spare else (),
        python_prefix=machine.launcher.python_prefix,
        trainer_args=args,
        trainer_options=tuple(workload.options),
        device=machine.node.device,
        torch_device=torch_device,
        backend=machine.backend,
        device_index=tuple(machine.devices.index_for(r, gpus) for r in range(ranks_per_node)),
        physical_devices=tuple(machine.devices.physical_for(r, gpus) for r in range(ranks_per_node)),
        python=python,
        python_is_submitters=machine.python == "auto",
        environment=environment,
        stage_env=request.stage_env,
        stage_dir=machine.environment.stage_dir if machine.environment else "/tmp",
        per_node=machine.launcher.per_node.format(**fields),
        watchdog_first_step=workload.watchdog.first_step_timeout if workload.watchdog.enabled else 0,
        watchdog_step=workload.watchdog.step_timeout if workload.watchdog.enabled else 0,
        walltime_margin=min(workload.watchdog.walltime_margin, walltime // 3),
        stop_signal=machine.launcher.stop_signal,
        login_hosts=tuple(machine.login_hosts),
        remote_jobs_dir=machine.remote_jobs_dir,
        workdir_given=request.workdir is not None,
    )
