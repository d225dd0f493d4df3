"""What the user asked for (Request) and every decision about one job (Plan), in named sections.

A Plan is immutable and built only by planning/resolve.py from validated inputs; the script
templates read its sections (`plan.layout.nodes`, `plan.queue.walltime_hms`, ...) and only
format them.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from dataclasses import field
from typing import TYPE_CHECKING, Any

from mmm_orch.dataclass_code import dataclass
from mmm_orch.injob import protocol
from mmm_orch.injob.protocol import LOG_FILE, NODES_TOKEN
from mmm_orch.options.plan import PlanOptions
from mmm_orch.schedulers import job_id_variables
from mmm_orch.walltime import format_walltime

if TYPE_CHECKING:
    from mmm_orch.planning.occupancy import QueueLoad


@dataclass(frozen=True)
class Request(PlanOptions):
    """What the user asked for, as typed (PlanOptions: the command line's options and the
    Python API's keywords), and what the use cases add to it."""

    avoid_nodes: tuple[str, ...] = ()  # nodes known to be bad on this machine (mmm-orch nodes)
    # The jobs the user and their project already have on the machine (planning/occupancy.py):
    # queue selection keeps to the facility's job-count limits with them; None: not counted.
    queue_load: QueueLoad | None = field(default=None, hash=False, compare=False)
    jobs: int = 1  # the jobs this request puts in its queue at once (a chain: its links)
    devices: int | None = None  # a run on this many devices of one node, beside other runs


@dataclass(frozen=True)
class Layout:
    """The nodes the launch runs on, the ranks on them and the parallel mesh over the ranks."""

    nodes: int
    ranks_per_node: int
    ranks: int
    gpus_per_node: int
    cpus_per_rank: int
    mesh: dict[str, int] = field(hash=False)


@dataclass(frozen=True)
class QueuePlan:
    """What the scheduler is asked for: queue, walltime, account and the resource directives."""

    name: str | None
    tier: str | None
    reason: str
    directives: tuple[str, ...]  # the queue's own directives
    walltime: int  # seconds
    account: str | None
    resources: tuple[str, ...]  # the machine's directives, for the allocated nodes (spares too)
    submit_dir_var: str  # the scheduler's variable holding the submission directory

    @property
    def walltime_hms(self) -> str:
        return format_walltime(self.walltime)


# The environment group of a run's own devices (DeviceShare.env), replaced where it is placed.
SHARE_GROUP = "devices of this run"


@dataclass(frozen=True)
class DeviceShare:
    """Some devices of one node, other runs on the rest (`sweep --pack --devices D`): the node's
    devices as the profile's devices.slots names them, which of them this run holds, and the
    launcher line and variables that give it those (the profile's, still to be filled)."""

    held: tuple[int, ...]  # positions on the node of the devices this run holds
    ids: tuple[str, ...]  # every device of the node, as a mask names it
    cpus: tuple[str, ...]  # the CPUs next to each device (none: the launcher picks)
    cpus_joined_by: str
    launcher: tuple[str, ...]  # {cpus} still to fill
    set: tuple[tuple[str, str], ...]  # (name, value) with {ids} and {first} still to fill

    @property
    def launcher_words(self) -> tuple[str, ...]:
        cpus = self.cpus_joined_by.join(self.cpus[i] for i in self.held) if self.cpus else ""
        return tuple(word.replace("{cpus}", shlex.quote(cpus)) for word in self.launcher)

    @property
    def env(self) -> tuple[EnvEntry, ...]:
        ids = ",".join(self.ids[i] for i in self.held)
        return tuple(
            EnvEntry(
                name=name, value=value.replace("{ids}", ids).replace("{first}", str(self.held[0]))
            )
            for name, value in self.set
        )


@dataclass(frozen=True)
class Devices:
    kind: str  # the profile's device: cuda, rocm, xpu, cpu
    torch: str  # the torch device type the trainers use (rocm runs as cuda)
    backend: str
    index: tuple[int, ...]  # set_device index per local rank
    physical: tuple[
        int | None, ...
    ]  # the physical device per local rank (visible devices reordered)
    share: DeviceShare | None = None  # some devices of one node, beside other runs


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
class Environment:
    """The software the job runs in: setup lines, variables and the job environment."""

    setup: tuple[str, ...]
    groups: tuple[EnvGroup, ...]
    # The job environment's directory as a shell word ('' when the machine has none): activated
    # after the setup lines, or copied to `stage_dir` on every node first (`stage`).
    path: str
    stage: bool
    stage_dir: str
    # The script runs in a login shell (`bash -l`: the system's and the user's start-up files,
    # which set up `module` on the facilities) or a plain one.
    login_shell: bool = True
    # The machine's software stack the setup lines load: its name, and the date and source of
    # its facts ('' for a profile's older `setup:` form, and in records made before stacks).
    stack: str = ""
    stack_date: str = ""
    stack_source: str = ""


# A command's run is told through the job's environment (protocol.RUN_DIR_VAR, RESUME_VAR,
# ALLOW_FRESH_VAR), not through options; a resumable one (the workload says so) takes all three.
COMMAND_OPTIONS = ("run_name",)
RESUMABLE_COMMAND_OPTIONS = ("run_name", "resume", "allow_fresh")


@dataclass(frozen=True)
class ProfilePlan:
    """How the run is profiled: torch.profiler in the program, or a facility's profiler (the
    machine's `profilers:`) the launch starts the chosen ranks under (injob/facility_profiler.py)."""

    tool: str  # torch, or the profiler's name
    ranks: str  # the ranks profiled ("": local rank 0 of each node)
    description: str = ""
    command: tuple[str, ...] = ()  # the profiler's words before the program; () for torch
    window: str = ""  # how the program opens and closes its collection (protocol.PROFILE_WINDOWS)
    setup: tuple[str, ...] = ()  # shell lines that make the tool available
    source: str = ""

    @property
    def command_line(self) -> str:
        """The profiler's words as injob/facility_profiler.py splits them (shlex), quoted only where a
        word needs it: the job script quotes the whole line again."""
        return " ".join(w if _PLAIN_WORD.fullmatch(w) else shlex.quote(w) for w in self.command)


_PLAIN_WORD = re.compile(r"[\w@%+=:,./{}-]+")


@dataclass(frozen=True)
class Launch:
    """The launcher line and the program it starts, and where it runs."""

    launcher: tuple[str, ...]
    # Where the launch runs: `hosts` by default; with spare nodes, the failover loop puts
    # Placement.on_nodes for the active nodes in place of NODES_TOKEN (injob/failover.py).
    hosts: str
    per_node: str  # the launcher prefix that runs a command once on every node
    python: str
    python_is_submitters: bool  # python: auto, the interpreter running mmm-orch
    python_prefix: bool  # mpiexec/srun start `python -m trainer`; torchrun takes `-m trainer`
    trainer: str
    args: dict[str, Any] = field(hash=False)
    options: tuple[str, ...]  # what the workload's trainer accepts
    stop_signal: str  # what the launcher passes on to the trainers (USR1, TERM)
    workdir: str
    workdir_given: bool  # False: a remote submission runs in its job directory instead
    # The user's own program in place of the trainer, after the launcher's command_prefix.
    command: tuple[str, ...] = ()
    start_gap: float = 0.0  # seconds between two launches started side by side in an allocation
    profile: ProfilePlan | None = None

    @property
    def program(self) -> tuple[str, ...]:
        """What each rank runs: the user's command or the trainer, through injob/facility_profiler.py
        when a facility's profiler runs the chosen ranks."""
        if self.command:
            program = self.command
        else:
            prefix = [self.python] if self.python_prefix else []
            program = (*prefix, "-m", self.trainer, *trainer_argv(self.args))
        if self.profile and self.profile.command:
            return (self.python, "-m", protocol.MODULES["profiled"], "--", *program)
        return program

    @property
    def run_dir(self) -> str:
        """Where the program writes metrics and checkpoints ('' for trainers without one)."""
        name = self.args.get("run_name")
        if not name or not (self.command or "output_dir" in self.options):
            return ""
        return os.path.join(self.workdir, str(self.args.get("output_dir", "outputs")), name)

    @property
    def tracking(self) -> dict[str, str]:
        """Where the run's trackers write (the trainers' --tensorboard and --wandb)."""
        if not self.run_dir:
            return {}
        where = {}
        if self.args.get("tensorboard"):
            where["tensorboard"] = os.path.join(self.run_dir, protocol.TENSORBOARD_DIR)
        if self.args.get("wandb", "off") != "off":
            where["wandb"] = (
                f"{self.args['wandb']}, {os.path.join(self.run_dir, protocol.WANDB_DIR)}"
            )
        return where

    @property
    def python_dir(self) -> str:
        return os.path.dirname(self.python)

    @property
    def can_resume(self) -> bool:
        """It saves on the stop signal and goes on from its checkpoint when told."""
        return "resume" in self.options

    @property
    def why_it_cannot_resume(self) -> str:
        return (
            "a command resumes only when its workload says `resumable: true`, keeping the "
            "runtime contract of docs/runtime.md"
            if self.command
            else "its trainer takes no --run-name/--resume"
        )

    @property
    def resume_argv(self) -> str:
        """What a failover relaunch adds to a trainer's words (a command is told through the
        environment instead)."""
        return "" if self.command or not self.can_resume else "--resume --allow-fresh"


@dataclass(frozen=True)
class Screen:
    """The screen before the launch (injob/screen.py): every node's matrix products on its
    devices, compared with the other nodes' and the devices' peak."""

    on_fail: str  # stop: a node far below is left out (a spare, else the job stops); warn
    seconds: int  # the bound on the whole screen
    of_median: float  # far below: under this fraction of the other nodes' median ...
    of_peak: float  # ... and of the peak, where the profile gives one
    peak_gflops: float | None  # one device's, dense bf16
    device: str  # torch's device type (cpu: a matrix product in Python)
    devices: int  # per node (0: the CPU alone)
    per_node: str  # the launcher's words that run a command once on each of the job's nodes
    # A node's high-speed-network address from its name, for the ring's links (plans recorded
    # before the ring: the node's name).
    host_addr: str = "{node}"


@dataclass(frozen=True)
class Stragglers:
    """The straggler watch while the run trains (runtime/stragglers.py)."""

    every: int  # steps between two checks of every rank's own matrix products
    checks: int  # below of_median of the others this many checks in a row: a straggler
    of_median: float
    action: str  # name; leave: save and go on without its node (failover, on a spare)

    @property
    def setting(self) -> str:
        """What the job script tells the ranks (protocol.STRAGGLERS_VAR)."""
        return f"{self.every},{self.checks},{self.of_median},{self.action}"


@dataclass(frozen=True)
class Guard:
    """The watchdog's limits and the stop before the walltime (injob/watchdog.py), and the
    screen before the launch."""

    first_step_timeout: int  # seconds; 0 = no watchdog
    step_timeout: int
    walltime_margin: int  # seconds before the walltime the trainers are asked to save and stop
    progress: str = "step"  # what counts as progress: step, output (any line), or a pattern
    screen: Screen | None = None  # None: no screen (one node, off, inside another allocation)
    stragglers: Stragglers | None = None  # None: no watch (one node, off)


@dataclass(frozen=True)
class Placement:
    """Which nodes: spares to fail over to, known-bad nodes to keep out."""

    spare_nodes: int
    avoid_nodes: tuple[str, ...]
    node_list: str  # the profile's command listing the job's nodes ("" = the scheduler's)
    on_nodes: str  # the launcher's words for "these nodes" (with failover)
    host_addr: str  # a node's address from its name ({node}, {short}): rank 0's after failover
    exclude_directive: str  # keeps the known-bad nodes out of the allocation ("" = none)
    failover_directives: tuple[str, ...]  # with spare nodes: a lost node does not end the job

    @property
    def failover(self) -> bool:
        """The launch runs under mmm_orch.injob.failover (it has spare nodes to swap in)."""
        return self.spare_nodes > 0


@dataclass(frozen=True)
class Transport:
    """Where a submission over SSH goes."""

    login_hosts: tuple[str, ...]
    remote_jobs_dir: str


@dataclass(frozen=True)
class JobPlace:
    """Set by Plan.placed() at submission: where the job's files are and how the scheduler tags it."""

    job_dir: str = ""
    tag: str = ""
    log_path: str | None = None
    log_directive: str = ""  # the log path as the scheduler's directive syntax needs it


@dataclass(frozen=True)
class ChainLink:
    """A link of a chain (submission/chains.py): its state file, its place, and the job it waits for."""

    file: str = ""
    link: int = 0
    links: int = 0
    depends_on: str = ""


@dataclass(frozen=True)
class CollectiveCount:
    """A collective one step of a rank issues: its op, its group's size, how often, GiB in all."""

    op: str
    group: int
    count: int
    gib: float


@dataclass(frozen=True)
class ShardShape:
    """A parameter's shard on a rank: its local and whole shapes and placements (dp=S(0) ...)."""

    name: str
    local: tuple[int, ...]
    whole: tuple[int, ...]
    placements: str


@dataclass(frozen=True)
class RankCheck:
    """One rank kind's figures from --verify: its peak by part (GiB), its collectives a step,
    its step's time on the job's device by the roofline (compute) and the network, its shards."""

    kind: str
    rank: int
    peak: dict[str, float] = field(hash=False)
    collectives: tuple[CollectiveCount, ...]
    compute_s: float
    network_s: float
    shards: tuple[ShardShape, ...]

    @property
    def total(self) -> float:
        return sum(self.peak.values())

    @property
    def sample_shards(self) -> tuple[ShardShape, ...]:
        """Its shards outside the blocks (a numbered list's: layers.N, blocks.N) and those of its
        first block (the others repeat it)."""
        first = next((block_of(s.name) for s in self.shards if block_of(s.name)), "")
        return tuple(s for s in self.shards if block_of(s.name) in ("", first))


def block_of(name: str) -> str:
    """The block a parameter's name is in ("layers.3" of "layers.3.attention.wq.weight"), ""
    outside the blocks."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 and parts[1].isdigit() else ""


@dataclass(frozen=True)
class Verified:
    """The check's report: each rank kind's figures, the torch that made them, how long it took,
    and where it and the analytic plan disagree by more than the plan's error."""

    ranks: tuple[RankCheck, ...]
    torch: str
    seconds: float
    disagreements: tuple[str, ...] = ()

    @property
    def busiest(self) -> RankCheck:
        return max(self.ranks, key=lambda r: r.total)

    @property
    def summary(self) -> str:
        top = self.busiest
        parts = ", ".join(f"{k} {v:.1f}" for k, v in top.peak.items())
        slowest = max(self.ranks, key=lambda r: r.compute_s + r.network_s)
        step = slowest.compute_s + slowest.network_s
        timed = (
            f"step ~{step:.2f} s on the device (roofline {slowest.compute_s:.2f} s, collectives "
            f"across nodes {slowest.network_s:.2f} s, not overlapped)"
            if step
            else "step not timed (the profile gives no device figures)"
        )
        return (
            f"{top.total:.1f} GiB on the {top.kind} (rank {top.rank}: {parts}); {timed} "
            f"({len(self.ranks)} rank kind(s), torch {self.torch}, {self.seconds:.0f} s)"
        )


@dataclass(frozen=True)
class MemoryPlan:
    """The trainer's estimated peak memory per device (planning/memory.py), in GiB by part, and
    the device's own (None where the profile does not say: nothing is refused there)."""

    parts: dict[str, float] = field(hash=False)
    device_gib: float | None
    pipeline: str = ""  # how a pipeline splits the model (pp > 1), for the script's reader

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    @property
    def summary(self) -> str:
        return (
            f"{self.total:.1f} GiB"
            + (f" of {self.device_gib:g}" if self.device_gib else "")
            + " ("
            + ", ".join(f"{k} {v:.1f}" for k, v in self.parts.items())
            + ")"
        )


@dataclass(frozen=True)
class CostPlan:
    """What the job can be charged (planning/cost.py): every node it holds, spares included, for
    the time the facility counts, at the machine's and the queue's charge factors."""

    unit: str
    nodes: int  # charged: active and spare
    spare_nodes: int
    walltime: int  # seconds asked for
    factor: float  # the machine's times the queue's
    charged_for: str  # elapsed or walltime
    minimum: int  # seconds charged at least
    source: str = ""
    budget: float | None = None  # --max-node-hours, in the unit
    share: float = 1.0  # the part of each node it holds (some of one node's devices: D of them)

    def charge(self, nodes: int, elapsed: float) -> float:
        """The charge of a job that held `nodes` (its share of them) for `elapsed` seconds."""
        return protocol.charge(
            nodes,
            elapsed,
            walltime=self.walltime,
            charged_for=self.charged_for,
            minimum=self.minimum,
            factor=self.factor,
            share=self.share,
        )

    @property
    def most(self) -> float:
        return self.charge(self.nodes, self.walltime)


@dataclass(frozen=True)
class Plan:
    """Every decision about one job; built only by resolve() from validated inputs."""

    mmm_orch_version: str
    machine: str
    facility: str
    scheduler: str
    scheduler_commands: dict[str, str] = field(hash=False)
    workload: str
    name: str
    layout: Layout
    queue: QueuePlan
    devices: Devices
    environment: Environment
    launch: Launch
    guard: Guard
    placement: Placement
    transport: Transport
    submission: JobPlace = JobPlace()
    chain: ChainLink = ChainLink()
    memory: MemoryPlan | None = None
    verified: Verified | None = None  # --verify's figures (planning/verification.py)
    cost: CostPlan | None = None

    @property
    def launch_line(self) -> str:
        """Launcher tokens come from the profile (trusted, may hold $VARS); argv is quoted. With
        failover, NODES_TOKEN marks where the active nodes go. Without a launcher (a pack job's
        program), the program alone."""
        launch = self.launch
        hosts = NODES_TOKEN if self.placement.failover else launch.hosts
        return " ".join(
            [
                *launch.launcher[:1],
                *([hosts] if hosts else []),
                *launch.launcher[1:],
                *(shlex.quote(a) for a in launch.program),
            ]
        )

    def job_id(self, otherwise: str) -> str:
        """The job's id in the job script's shell: the first scheduler's job id variable that is
        set (every kind's: `launch` runs the local kind's script inside another's allocation),
        else `otherwise`, e.g. `${PBS_JOBID:-${SLURM_JOB_ID:-local}}`."""
        expression = otherwise
        for variable in reversed(job_id_variables()):
            expression = f"${{{variable}:-{expression}}}"
        return expression

    @property
    def stops_before_walltime(self) -> bool:
        """The watchdog asks the trainer to save and stop before the walltime: only a trainer
        that can resume (the stop signal would merely kill any other program early)."""
        return bool(self.guard.step_timeout) and self.launch.can_resume

    def with_launch(self, **changes: Any) -> Plan:
        return dataclasses.replace(self, launch=dataclasses.replace(self.launch, **changes))

    def on_devices(self, held: tuple[int, ...]) -> Plan:
        """A plan on some devices of one node (devices.share) moved to the devices at `held`:
        its launcher line and its devices' variables follow them."""
        if self.devices.share is None:
            raise TypeError("on_devices: the plan holds whole nodes, not some devices of one")
        share = dataclasses.replace(self.devices.share, held=tuple(held))
        environment = dataclasses.replace(
            self.environment,
            groups=tuple(
                dataclasses.replace(group, set=share.env) if group.name == SHARE_GROUP else group
                for group in self.environment.groups
            ),
        )
        return dataclasses.replace(
            self.with_launch(launcher=share.launcher_words),
            devices=dataclasses.replace(self.devices, share=share),
            environment=environment,
        )

    def waiting_for(self, job_id: str) -> Plan:
        """A chain link's plan that starts once the job `job_id` has ended."""
        return dataclasses.replace(self, chain=dataclasses.replace(self.chain, depends_on=job_id))

    def placed(
        self, job_dir: str, tag: str, log_directive: str, workdir: str | None = None
    ) -> Plan:
        """The plan of a submission: its job directory and log (and, for a remote job, the
        directory it runs in there), its tag, and a run directory of its own unless the user
        named one (so that no two runs share metrics or checkpoints by accident)."""
        args = dict(self.launch.args)
        if "run_name" in self.launch.options and not args.get("run_name"):
            args["run_name"] = f"{self.name}-{tag}"
        submission = JobPlace(
            job_dir=job_dir, tag=tag, log_path=f"{job_dir}/{LOG_FILE}", log_directive=log_directive
        )
        return dataclasses.replace(
            self.with_launch(workdir=workdir or self.launch.workdir, args=args),
            submission=submission,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            **_plain(self),
            "program": list(self.launch.program),
            "launch_line": self.launch_line,
            "run_dir": self.launch.run_dir,
            "tracking": self.launch.tracking,
        }


def _plain(value: Any) -> Any:
    """dataclasses.asdict for a plan, whose leaves are str, numbers, bools and None: nothing to
    deep-copy, which makes it 3x faster (a submission records its plan)."""
    if hasattr(value, "__dataclass_fields__"):
        return {name: _plain(getattr(value, name)) for name in value.__dataclass_fields__}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(item) for item in value)
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def trainer_argv(args: dict[str, Any]) -> list[str]:
    argv: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + key.replace("_", "-"))
        else:
            argv += [flag, str(value)]
    return argv
