"""Machine profile: scheduler, node shape, queues, environment, launcher, binding.

Modelled on ReFrame's system/partition/launcher/environment split, with the facility
facts (and their sources) in machines/*.yaml rather than in code.
"""

from __future__ import annotations

import re
import sys
from dataclasses import field
from typing import TYPE_CHECKING, Annotated, Literal

if sys.version_info >= (3, 11):  # the regex parser: re._parser from Python 3.11, sre_parse before
    from re import _parser as sre_parse
else:  # pragma: no cover - Python 3.10
    import sre_parse

from mmm_orch.config.charging import Charging, check_factor
from mmm_orch.config.common import (
    SHELL_LINES,
    Bound,
    Check,
    EnvName,
    Flag,
    Fraction,
    NodeTemplated,
    NonEmptyStr,
    NonNegativeInt,
    PositiveInt,
    PositiveNumber,
    ShellValue,
    SlotTemplated,
    Templated,
    Walltime,
    check_placeholders,
    config,
)
from mmm_orch.config.queues import JobLimit, NodeCount, Queue
from mmm_orch.errors import MmmError
from mmm_orch.injob import ends, protocol
from mmm_orch.schedulers import kind_names

if TYPE_CHECKING:
    SchedulerKindName = str
    EndInLog = str
else:  # the registry's kinds, as pydantic checks and the schema lists them
    SchedulerKindName = Literal[kind_names()]
    EndInLog = Literal[ends.LOG_CLASSES]  # the end classes a log line can tell


@config
class SchedulerCommands:
    # The submit command, if not the scheduler's own (sbatch, qsub).
    submit: str = ""
    # The status command, if not the scheduler's own.
    query: str = ""
    # The cancel command, if not the scheduler's own.
    cancel: str = ""
    accounting: str = ""  # finished jobs (sacct); PBS keeps history in `qstat -x`


@config
class Scheduler:
    # Which scheduler speaks to it: a folder of mmm_orch/schedulers/ each.
    kind: SchedulerKindName
    # Its commands, where they differ from the usual names.
    commands: SchedulerCommands = field(default_factory=SchedulerCommands)
    # Directive for the chosen queue unless the queue lists its own, e.g. "-q {queue}".
    queue_directive: str = ""
    # Where the scheduler starts the script; the script cd's there ("" = the plan's workdir).
    submit_dir_var: str = ""
    # Directives that must never appear (e.g. PBS -V, which breaks startup on ALCF systems).
    forbidden_directives: list[str] = field(default_factory=list)
    # A shell command printing the job's nodes, one a line, in order, where the scheduler's own
    # listing does not name them apart ("" = the scheduler's: Slurm's node list, PBS's node file).
    node_list: str = field(default="", metadata=SHELL_LINES)
    # The directive keeping nodes out of the allocation ({nodes}: comma-separated), for nodes
    # known to be bad; "" where the scheduler has none (PBS: failover keeps them out of the
    # launch instead).
    exclude_directive: str = ""
    # Directives of a job holding spare nodes, so that losing a node does not end it.
    failover_directives: list[str] = field(default_factory=list)


@config
class NodeShape:
    # Physical CPU cores per node.
    cores: PositiveInt
    # Hardware threads per core.
    threads_per_core: PositiveInt = 1
    # Cores kept for the system, never bound to a rank (a profile names them).
    reserved_cores: list[NonNegativeInt] = field(default_factory=list)
    # Accelerators as the launcher counts them: GPUs, PVC tiles or MI250X GCDs.
    gpus: NonNegativeInt
    # The accelerators' kind, as torch names its device type.
    device: Literal["cuda", "rocm", "xpu", "cpu"]
    # The accelerator's name, for people.
    gpu_model: str = ""
    # Memory per device; the memory plan refuses a job that does not fit in it.
    gpu_memory_gib: PositiveNumber | None = None
    # The node's memory.
    memory_gib: PositiveNumber | None = None
    # What torch's scaled_dot_product_attention runs in training here: a fused kernel, or the
    # math one, which saves every head's s x s attention probabilities (planning/memory.py).
    attention_kernel: Literal["fused", "math"] = "fused"
    # One device's peak dense bf16 TFLOPS, its memory's bandwidth (TB/s) and the node's network
    # injection bandwidth (GB/s, all its NICs): --verify's step-time roofline (None: not timed).
    peak_tflops: PositiveNumber | None = None
    memory_tbs: PositiveNumber | None = None
    network_gbs: PositiveNumber | None = None
    # The share of a device's memory --verify keeps free of the trainer's peak (the allocator's
    # fragmentation, the communication library's buffers).
    memory_headroom: Annotated[float, Bound("Ge", 0), Bound("Le", 0.9)] = 0.1

    @property
    def usable_cores(self) -> int:
        return self.cores - len(self.reserved_cores)


@config
class EnvVar:
    # The variable's value (one line; quoted into the script).
    value: ShellValue
    # Where the facility says so: its page (and date), or the live server's setting.
    source: str = ""


@config
class Preset:
    """A named, cited group of environment variables (e.g. the oneCCL minimal set)."""

    # The name --preset and --no-preset take.
    name: NonEmptyStr
    # What it is for, in one line.
    description: str = ""
    # Where the facility says so: its page (and date), or the live server's setting.
    source: str = ""
    # On unless --no-preset NAME.
    default: Flag = False
    # Applies only within this node-count range (e.g. NCCL_NET=Socket on one node).
    min_nodes: PositiveInt = 1
    # Applies only up to this many nodes.
    max_nodes: PositiveInt | None = None
    # Variables it sets: a value, or a value with its source.
    set: dict[EnvName, ShellValue | EnvVar] = field(default_factory=dict)
    # Variables it removes from the job's environment.
    unset: list[EnvName] = field(default_factory=list)

    def applies_to(self, nodes: int) -> bool:
        return self.min_nodes <= nodes and (self.max_nodes is None or nodes <= self.max_nodes)


@config
class Launcher:
    # Which launcher: mpiexec (PALS or MPICH), srun or torchrun.
    kind: Literal["mpiexec", "srun", "torchrun"]
    # The launcher's program (mpiexec, srun, torchrun).
    command: Templated
    # Its arguments, each one word; a placeholder in braces is filled in from the plan.
    args: list[Templated] = field(default_factory=list)
    # mpiexec/srun start "python -m trainer"; torchrun takes "-m trainer" itself.
    python_prefix: Flag = True
    # Words before a user's own command (`mmm-orch submit MACHINE -- CMD`): torchrun runs a
    # Python script unless told --no-python.
    command_prefix: list[str] = field(default_factory=list)
    # PALS-style per-rank CPU list "list:a-b:c-d:...", one entry per rank on a node.
    cpu_bind: str = ""
    # Runs a command once on every node of the job (staging the job environment); "" runs it
    # once here (one node).
    per_node: Templated = ""
    # The nodes a launch runs on: `hosts` as it runs by default ("" = all of the job's, the
    # launcher's default); `on_nodes` for some of them ({nodelist}: comma-separated names,
    # {hostfile}: a file with one name a line), used when the job holds spare nodes.
    hosts: str = ""
    # The launcher's words that run it on some nodes only ({nodelist}, {hostfile}).
    on_nodes: str = ""
    # What the launch gets to save a checkpoint and stop before the walltime: srun forwards
    # USR1 to every task (TERM makes it kill them), torchrun forwards TERM (USR1 kills it).
    stop_signal: Literal["USR1", "USR2", "TERM", "INT"] = "USR1"
    # Seconds between two launches started side by side in one allocation (`sweep --pack`):
    # some facilities ask for a pause between background launches (OLCF: `sleep 1` between srun).
    start_gap: Annotated[float, Bound("Ge", 0), Bound("Le", 60)] = 0
    # Where the facility says so: its page (and date), or the live server's setting.
    source: str = ""


# A word of a profiler's command: {output} is where a profiled rank's files go (the run's
# profile/<host>_rank<R>, the tool adding its own suffix), {output_dir} a directory by that name.
ProfilerWord = Annotated[
    str,
    Bound("MinLen", 1),
    Check(after=lambda text: check_placeholders(text, ("output", "output_dir"))),
]


@config
class Profiler:
    """A facility's profiler (`--profile nsys`): the launch runs the chosen ranks under it, and
    the trainers open and close it at the profiled window's first and last step (`window`,
    protocol.PROFILE_WINDOWS). Its words are literal: they are quoted into the job script and
    split again inside the job, never run by a shell."""

    # What it shows, in one line.
    description: NonEmptyStr
    # Words put before each rank's program.
    command: list[ProfilerWord]
    window: str
    # Shell lines before the launch that make the tool available (a module load).
    setup: list[str] = field(default_factory=list, metadata=SHELL_LINES)
    # Where the facility says so: its page (and date), or the live server's setting.
    source: str = ""

    def __post_init__(self) -> None:
        if self.window not in protocol.PROFILE_WINDOWS:
            raise ValueError(
                f"window {self.window!r}: expected one of {', '.join(protocol.PROFILE_WINDOWS)}"
            )
        outputs = sum(
            word.count(protocol.PROFILER_OUTPUT) + word.count(protocol.PROFILER_OUTPUT_DIR)
            for word in self.command
        )
        if outputs != 1:
            raise ValueError(
                f"command: name {protocol.PROFILER_OUTPUT} or {protocol.PROFILER_OUTPUT_DIR} "
                f"once (where a profiled rank's files go), not {outputs} times"
            )


# A device's name in a mask, or the CPUs next to it in the launcher's words: "0.1", "24-31".
DeviceWord = Annotated[str, Check(after=lambda text: _device_word(text))]


def _device_word(text: str) -> str:
    if not re.fullmatch(r"[0-9][0-9.,\-]{0,63}", text):
        raise ValueError(f"{text!r}: digits with '.', ',' or '-' (a device or CPU list)")
    return text


def _slot_placeholders(text: str) -> str:
    return check_placeholders(text, ("ids", "first"))


@config
class DeviceSlots:
    """Runs side by side on one node (`sweep --pack --devices D`), each on D of its devices: what
    each device is called in a mask, the CPUs next to it, and the launch and the variables each
    run gets. Machine data, with sources: the facilities' own recipes for many runs on a node."""

    # Every device of a node, as the mask names it, in the order runs take them.
    ids: Annotated[list[DeviceWord], Bound("MinLen", 1)]
    # The launcher's arguments for a run on some devices of one node, in place of launcher.args:
    # {cpus} are the CPUs of its devices (`cpus`, one entry a rank, joined by `cpus_joined_by`).
    launcher_args: list[SlotTemplated]
    # The CPUs next to each device, in the launcher's words ([] where the launcher picks them).
    cpus: list[DeviceWord] = field(default_factory=list)
    cpus_joined_by: Literal[":", ","] = ":"
    # Exported for each run: {ids} are its devices' ids joined by ',', {first} the position of
    # its first device on the node (a per-launch counter that concurrent launches need apart).
    set: dict[EnvName, Annotated[ShellValue, Check(after=_slot_placeholders)]] = field(
        default_factory=dict
    )
    # Where the facility says so: its page (and date), or the live server's setting.
    source: str = ""

    def __post_init__(self) -> None:
        if len(set(self.ids)) != len(self.ids):
            raise ValueError("ids repeat: each device of a node once")
        if self.cpus and len(self.cpus) != len(self.ids):
            raise ValueError(
                f"cpus lists {len(self.cpus)} entries for {len(self.ids)} devices "
                "(one each, or none where the launcher picks)"
            )
        if not self.cpus and any("{cpus}" in arg for arg in self.launcher_args):
            raise ValueError("launcher_args name {cpus} but no cpus are listed")


@config
class Devices:
    """How a rank finds its accelerator."""

    # Exported order of visible devices, e.g. [3, 2, 1, 0] when CPU affinity is reversed.
    visible: list[NonNegativeInt] = field(default_factory=list)
    visible_env: str = "CUDA_VISIBLE_DEVICES"
    # Each rank sees only its own device (srun --gpus-per-task=1): index 0 for every rank.
    one_per_rank: Flag = False
    slots: DeviceSlots | None = None
    # Where the facility says so: its page (and date), or the live server's setting.
    source: str = ""

    def index_for(self, local_rank: int, gpus_per_node: int) -> int:
        """Device index a rank passes to set_device (local rank modulo visible devices)."""
        visible = 1 if self.one_per_rank else (len(self.visible) or gpus_per_node or 1)
        return local_rank % visible

    def physical_for(self, local_rank: int, gpus_per_node: int) -> int | None:
        """Physical device a rank ends up on, where the profile pins it."""
        if self.one_per_rank:
            return None  # chosen by the launcher (e.g. --gpu-bind=closest)
        index = self.index_for(local_rank, gpus_per_node)
        return self.visible[index] if self.visible else index


@config
class Rendezvous:
    # Shell expressions evaluated in the job script on the first node.
    master_addr: str = field(default="", metadata=SHELL_LINES)
    # The rendezvous port (MASTER_PORT).
    master_port: str = field(default="", metadata=SHELL_LINES)
    # The address at which ranks reach a node of the job's node list ({node}: its name there,
    # {short}: up to the first dot). Failover puts rank 0 on the first active node, which need
    # not be the job's first.
    host_addr: NodeTemplated = "{node}"
    # Where the facility says so: its page (and date), or the live server's setting.
    source: str = ""


def _regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"{value!r} is not a valid regular expression: {exc}") from None
    if _backtracks(sre_parse.parse(value)):
        raise ValueError(
            f"{value!r} repeats a repetition or an alternation (like (a+)+ or "
            "(a|ab)*): on a long log line it backtracks for hours; write it "
            "without the nesting"
        )
    return value


def _backtracks(items, repeated: bool = False) -> bool:
    """Whether a parsed regex nests a repetition, or an alternation, inside a repetition of
    more than one: what makes Python's backtracking matcher exponential."""
    for op, arg in items:
        if op in (sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT):
            many = arg[1] > 1
            if (repeated and many) or _backtracks(arg[2], repeated or many):
                return True
        elif op is sre_parse.BRANCH:
            if (repeated and len(arg[1]) > 1) or any(_backtracks(b, repeated) for b in arg[1]):
                return True
        elif (op is sre_parse.SUBPATTERN and _backtracks(arg[-1], repeated)) or (
            op in (sre_parse.ASSERT, sre_parse.ASSERT_NOT) and _backtracks(arg[1], repeated)
        ):
            return True
    return False


Regex = Annotated[str, Check(after=_regex)]


@config
class FailureSignature:
    """A known way for a job to fail: a regex over log lines (a `host` group names the node),
    what it means, the documented fix and where that fix comes from."""

    # Its name, as diagnose and failover print it.
    name: NonEmptyStr
    # A regular expression a line of the log matches.
    pattern: Regex
    # What happened, in words.
    meaning: str = ""
    # What to do about it.
    fix: str = ""
    # Where the facility says so: its page (and date), or the live server's setting.
    source: str = ""
    # fallout: a consequence of a failure elsewhere (ranks killed after another rank died), never
    # reported as the first failure. catch_all: only reported when nothing specific matched.
    # consequence: what the surviving ranks see when a peer died (gloo "connection closed by
    # peer", a collective timing out): reported only when no cause, specific or catch-all, is
    # in the log, since the peer's own failure is the story.
    fallout: Flag = False
    catch_all: Flag = False
    consequence: Flag = False
    # node_fault: the named host lost its ranks (killed, unreachable): failover retires it and
    # mmm-orch remembers it for later jobs on the machine.
    node_fault: Flag = False
    # The end class the line tells (docs/reference/exit-codes.md): by default node-lost for a
    # node fault, else crash (or no-first-step before the first step).
    end: EndInLog | None = None


@config
class FailureCatalog:
    """machines/common/failures.yaml: the signatures that hold on every machine."""

    failures: list[FailureSignature] = field(default_factory=list)


@config
class JobEnvironment:
    """Where the machine's job environment lives by default: a virtual environment with mmm-orch,
    made on top of the setup lines by `mmm-orch env create` (which may be told another path)."""

    # A directory on the shared filesystem; {account} and {account_lower} are filled from the
    # plan, $USER and other variables expand where the environment is made and used.
    path: ShellValue
    # Node-local storage the environment is copied to with --stage-env (one copy per node).
    stage_dir: ShellValue = "/tmp"
    # Where the facility says so: its page (and date), or the live server's setting.
    source: str = ""


def _stack_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", name):
        raise ValueError(f"stack name {name!r}: letters, digits, '.', '_' and '-', at most 64")
    return name


def _date(text: str) -> str:
    if text and not re.fullmatch(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]", text):
        raise ValueError(f"date {text!r}: the day the facts were read, as YYYY-MM-DD (quoted)")
    return text


def _version_prefix(value: object) -> object:
    # YAML reads torch: 2.10 as the number 2.1: a version is quoted.
    if not isinstance(value, str):
        raise ValueError(f'{value!r}: quote the version, e.g. "2.10"')
    if not re.fullmatch(r"[0-9][0-9A-Za-z.+_-]{0,39}", value):
        raise ValueError(f'{value!r}: a version or its start, e.g. "2.13"')
    return value


def _package(name: str) -> str:
    if not re.fullmatch(r"[a-z][a-z0-9_.-]{0,39}", name):
        raise ValueError(f"{name!r}: a package's name in lower case (torch, python)")
    return name


@config
class Stack:
    """A facility's software stack as it was on a day: the lines that load it, the module tree
    they need, what it gives and the variables it sets, with the date and the source of those
    facts. A profile keeps older stacks while the facility keeps them (`--stack NAME`)."""

    # The name --stack takes.
    name: Annotated[str, Check(after=_stack_name)]
    # The stack a job gets without --stack (the first so marked, else the first listed).
    default: Flag = False
    # When its facts were read (YYYY-MM-DD); required, except in a profile's old `setup:` form.
    date: Annotated[str, Check(after=_date)] = ""
    # Where the facility says so: its page (and date).
    source: str = ""
    # The module tree its modules need, put on the module path (`module use`) before `setup`.
    module_tree: ShellValue = ""
    # Shell lines that load it (module loads), written into the job script as they are.
    setup: list[str] = field(default_factory=list, metadata=SHELL_LINES)
    # What it gives, by package: the start of the version (torch: "2.13", python: "3.12").
    gives: dict[
        Annotated[str, Check(after=_package)], Annotated[str, Check(before=_version_prefix)]
    ] = field(default_factory=dict)
    # Environment variables its modules set and the profile relies on, with their values.
    sets: dict[EnvName, ShellValue] = field(default_factory=dict)
    # What a reader should know about it, in one paragraph.
    notes: str = ""

    def lines(self) -> list[str]:
        """The shell lines a job runs to load the stack: setup, with its module tree put on the
        module path (`module use`) before the first `module` line (the lines before it may
        make `module`: a shell without start-up files sources the module system's init)."""
        if not self.module_tree:
            return list(self.setup)
        first = next(
            (i for i, line in enumerate(self.setup) if re.match(r"\s*(module|ml)\b", line)),
            len(self.setup),
        )
        tree = f'module use "{self.module_tree}"'
        return [*self.setup[:first], tree, *self.setup[first:]]


@config
class Account:
    # A job without -A (or $MMM_ORCH_ACCOUNT, or the default) is refused.
    required: Flag = False
    # The account when none is given.
    default: str = ""


@config
class Screen:
    """The screen at the start of a job of more than one node (mmm_orch/injob/screen.py): each
    node's matrix products before the trainer, and which node is far enough below to be left
    out (below both fractions: of the job's other nodes' median and of node.peak_tflops)."""

    # What a job of more than one node does by default: stop (a node far below is left out: a
    # spare takes its place, else the job stops before the trainer), warn (it is named and
    # kept), off.
    default: Literal["stop", "warn", "off"] = "stop"
    # The bound on the whole screen, its per-node launch included.
    seconds: PositiveInt = 60
    of_median: Fraction = 0.5
    of_peak: Fraction = 0.3
    # While the run trains (runtime/stragglers.py): a rank's own products timed every so many
    # steps; below of_median of the other ranks' this many checks in a row, it is a straggler.
    straggler_every: PositiveInt = 50
    straggler_checks: PositiveInt = 3
    # Where the fractions come from (or why these).
    source: str = ""


@config
class Machine:
    # The name `mmm-orch submit NAME` takes; the file's name, too.
    name: NonEmptyStr
    # Who runs the machine (ALCF, NERSC, OLCF), as `mmm-orch machines` shows it.
    facility: str = ""
    # One line about the machine: its nodes and network.
    description: str = ""
    extends: str = ""  # only meaningful in user override files; resolved by the registry
    # The scheduler, its commands and its directives' rules.
    scheduler: Scheduler
    # Where `submit --host` and `env create --host` log in (SSH), in order.
    login_hosts: list[str] = field(default_factory=list)
    # Host names of the machine (compute and login nodes), each a regular expression matched
    # whole, as ReFrame's `hostnames`: `mmm-orch launch` without a MACHINE finds the profile
    # whose patterns match the allocation's first node or this host.
    hostnames: list[Regex] = field(default_factory=list)
    # Job directories on the login node when submitting over SSH (relative to the remote home).
    remote_jobs_dir: str = ".local/state/mmm-orch/jobs"
    # One compute node: its cores, accelerators and memory.
    node: NodeShape
    # The most nodes a job may ask for.
    max_nodes: NodeCount
    # How the job starts its ranks (mpiexec, srun or torchrun), and their binding.
    launcher: Launcher
    # torch.distributed's backend on this machine's devices.
    backend: Literal["nccl", "xccl", "ccl", "gloo"]
    ranks_per_node: PositiveInt | None = None  # default: one per accelerator
    # Check every plan's layout before the queue, as --verify does (planning/verification.py).
    verify: bool = False
    # The shortest walltime the scheduler takes, if it has one.
    min_walltime: Walltime | None = None
    # Whether a job needs an account (-A), and its default.
    account: Account = field(default_factory=Account)
    # How jobs are charged, and the tool that tells an allocation's balance.
    charging: Charging = field(default_factory=Charging)
    # Directives of every job; a placeholder in braces ({nodes}, ...) is filled in from the plan.
    directives: list[Templated] = field(default_factory=list)
    # The queues (partitions, QOS) in the order a job without --queue tries them.
    queues: list[Queue] = field(default_factory=list)
    # The software stacks (modules and what they give), the default first or marked `default`.
    stacks: list[Stack] = field(default_factory=list)
    # The older form of one stack: shell lines run before the launch (module loads). A profile
    # with `setup:` and no `stacks:` has one stack, named "default", with these lines.
    setup: list[str] = field(default_factory=list, metadata=SHELL_LINES)
    # The job script runs in a login shell (bash -l: the start-up files that set up `module`,
    # as the facilities' examples do); the test servers' jobs must not read this host's.
    login_shell: Flag = True
    # Named, cited groups of environment variables, on by default or by --preset.
    presets: list[Preset] = field(default_factory=list)
    # How a rank picks its device (the visible-devices variable, slots for packed runs).
    devices: Devices = field(default_factory=Devices)
    # The screen at a job's start: its time bound and thresholds.
    screen: Screen = field(default_factory=Screen)
    # Where the ranks meet (MASTER_ADDR and port).
    rendezvous: Rendezvous = field(default_factory=Rendezvous)
    python: str = "python3"  # "auto": the interpreter running mmm-orch
    # The job environment: where `mmm-orch env create` makes the virtual environment the jobs run
    # in.
    environment: JobEnvironment | None = None
    # Facts a reader of the profile should know; shown by `mmm-orch show machine`.
    notes: list[str] = field(default_factory=list)
    # Job-count limits over all the machine's queues (e.g. 100 jobs per user in all of them).
    job_limits: list[JobLimit] = field(default_factory=list)
    # Log lines that name a known failure, its cause and fix (`mmm-orch diagnose`, failover).
    failures: list[FailureSignature] = field(default_factory=list)
    # The facility's profilers by the name --profile takes (nsys, unitrace, rocprof, ...).
    profilers: dict[Annotated[str, Check(after=lambda name: _profiler_name(name))], Profiler] = (
        field(default_factory=dict)
    )

    @property
    def default_ranks_per_node(self) -> int:
        return self.ranks_per_node or self.node.gpus or 1

    def preset(self, name: str) -> Preset | None:
        return next((p for p in self.presets if p.name == name), None)

    def queue(self, name: str) -> Queue | None:
        return next((q for q in self.queues if q.name == name), None)

    def stack(self, name: str | None = None) -> Stack:
        """The stack named `name`; the default one for None."""
        if name is None:
            return next((s for s in self.stacks if s.default), self.stacks[0])
        found = next((s for s in self.stacks if s.name == name), None)
        if found is None:
            raise MmmError(
                f"--stack {name}: machine {self.name} has stacks "
                f"{', '.join(s.name for s in self.stacks)}"
            )
        return found

    def __post_init__(self) -> None:
        self._check_stacks()
        names = [p.name for p in self.presets]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"preset names repeat: {', '.join(sorted(dupes))}")
        qnames = [q.name for q in self.queues]
        if len(set(qnames)) != len(qnames):
            raise ValueError("queue names repeat")
        for q in self.queues:
            if q.charge_factor is not None:
                check_factor(f"queue {q.name}: charge_factor", q.charge_factor)
            if q.min_nodes > q.max_nodes:
                raise ValueError(
                    f"queue {q.name}: min_nodes {q.min_nodes} > max_nodes {q.max_nodes}"
                )
        for line in self.directives:
            for bad in self.scheduler.forbidden_directives:
                if line.split()[:1] == [bad] or line == bad:
                    raise ValueError(f"directive {line!r} is forbidden on {self.name}")
        if self.profilers and not self.launcher.python_prefix:
            raise ValueError(
                "profilers: the launcher starts Python itself (torchrun), so it cannot start a "
                "rank under a profiler"
            )
        if self.launcher.cpu_bind:
            check_cpu_bind(
                self.launcher.cpu_bind, self.default_ranks_per_node, set(self.node.reserved_cores)
            )

    def _check_stacks(self) -> None:
        if self.setup and self.stacks:
            raise ValueError(
                "setup and stacks: give the setup lines in a stack (a profile extending one "
                "with stacks writes stacks, too)"
            )
        if not self.stacks:  # the older form, or no setup at all: one stack, "default"
            object.__setattr__(self, "stacks", [Stack(name="default", setup=list(self.setup))])
            object.__setattr__(self, "setup", [])
            return
        names = [s.name for s in self.stacks]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"stack names repeat: {', '.join(sorted(dupes))}")
        implicit = len(self.stacks) == 1 and self.stacks[0].name == "default"
        for stack in self.stacks:
            if not implicit and not (stack.date and stack.source.strip()):
                raise ValueError(
                    f"stack {stack.name}: date and source are required (when its facts were "
                    "read, YYYY-MM-DD, and where)"
                )


def _profiler_name(name: str) -> str:
    if name in ("off", "torch") or not re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", name):
        raise ValueError(
            f"profiler name {name!r}: lower-case letters, digits, '_' and '-', at most 32, "
            "starting with a letter; not off or torch (--profile's own values)"
        )
    return name


def parse_cpu_bind(text: str) -> list[set[int]]:
    """Cores of each rank in a PALS list ("[verbose,]list:4-7:8-11,12"); ':' separates ranks."""
    body = text.split("list:", 1)
    if len(body) != 2:
        return []
    ranks = []
    for rank_spec in body[1].split(":"):
        cores: set[int] = set()
        for part in rank_spec.split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise ValueError(f"cpu_bind {text!r}: cannot read {rank_spec!r}")
            cores.update(range(int(lo), int(hi or lo) + 1))
        ranks.append(cores)
    return ranks


def check_cpu_bind(text: str, ranks_per_node: int, reserved: set[int]) -> None:
    ranks = parse_cpu_bind(text)
    if not ranks:
        return  # depth/core/none bindings carry no list to check
    if len(ranks) != ranks_per_node:
        raise ValueError(
            f"cpu_bind lists {len(ranks)} ranks but the node runs {ranks_per_node} ranks"
        )
    for i, cores in enumerate(ranks):
        if cores & reserved:
            raise ValueError(f"cpu_bind gives rank {i} reserved cores {sorted(cores & reserved)}")
    for i, a in enumerate(ranks):
        for b in ranks[i + 1 :]:
            if a & b:
                raise ValueError(f"cpu_bind gives cores {sorted(a & b)} to two ranks")
