"""What a job tells mmm-orch: the marker lines of its log, its exit codes and the files it leaves
in its job directory (the JSON ones typed and versioned in files.py: FailoverState, ChainState,
Outcome); and what the job script tells its in-job programs (OPTIONS, the *_VAR variables). This
module is the only definition of each. The job's writers (the
templates, the watchdog, failover, the chain, the trainers' runtime) and mmm-orch's readers
(status, the startup timeline, reports) all use these names, and the templates get them as
`job.marker`, `job.exit`, `job.file` and `job.module`, so what a job prints and how it is read
cannot drift apart.

Standard library only, importing nothing of mmm-orch: it runs inside jobs, in the job's Python.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from types import MappingProxyType

PREFIX = "[mmm-orch]"

# -- exit codes ---------------------------------------------------------------------------------
EXIT_CHAIN_SKIP = 10  # chain begin: the chain has ended, this link does not run
EXIT_INTERNAL_ERROR = 70  # EX_SOFTWARE: failover's own loop failed, the job ends
EXIT_CHECKPOINTED = 75  # EX_TEMPFAIL: the trainers saved before the walltime; resume
EXIT_SCREENED_OUT = 78  # EX_CONFIG: the screen left out nodes the launch needs; nothing trained
EXIT_HUNG = 124  # timeout(1)'s code: the watchdog ended a launch that made no progress
EXIT_STOPPED_BY_TERM = 143  # 128 + SIGTERM: cancelled or deleted, whatever the launch returned

# -- files in the job's directory ----------------------------------------------------------------
LOG_FILE = "job.log"  # the job's stdout and stderr
RECORD_FILE = "record.json"  # the job's record, written at submission (db recover reads it)
NODES_FILE = "nodes.txt"  # the allocation's nodes, in order (failover)
FAILURES_FILE = "failures.json"  # the machine's failure signatures (failover)
FAILOVER_FILE = "failover.json"  # where failover stands: attempt, active, spares, retired
ACTIVE_HOSTS_FILE = (
    "active-hosts.txt"  # the host file of the active nodes (launchers that read one)
)
CHAIN_FILE = "chain.json"  # a chain's state, in the chain's directory
OUTCOME_FILE = "outcome.json"  # how the launch ended (the watchdog, failover, the chain)
SCREEN_FILE = "screen.json"  # the screen's figures per node, and the nodes it left out
SCREEN_DIR = "screen"  # beside it: each node's own figures, RANK.json, as it measured them
STRAGGLERS_FILE = "stragglers.json"  # in the run's directory: the ranks named stragglers
LINK_ID = re.compile(r"link-(\d+)\.id")  # beside it: a link's scheduler id, written once
METRICS_FILE = "metrics.jsonl"  # the trainers' step records, in the run directory
RESULT_FILE = "result.json"  # the local executor: how the job ended
SUPERVISOR_FILE = "supervisor.json"  # the local executor: the supervising process
CANCEL_SENT_FILE = "cancel-sent"  # the local executor: `cancel` signalled the supervisor

# The launch line's stand-in for "the active nodes": failover puts the launcher's words there.
NODES_TOKEN = "@NODES@"

# -- what the job tells the program it launches (the environment; runtime/contract.py reads it) ---
RUN_DIR_VAR = "MMM_ORCH_RUN_DIR"  # the run's directory: metrics and checkpoints go there
RESUME_VAR = "MMM_ORCH_RESUME"  # "1": continue from the run's latest checkpoint
ALLOW_FRESH_VAR = "MMM_ORCH_ALLOW_FRESH"  # "1": with RESUME, no checkpoint yet is not an error
# When the job's walltime runs out (epoch seconds; the script exports it): what runs inside the
# job (a pack's points) keeps its own walltimes within it.
JOB_END_VAR = "MMM_ORCH_JOB_END"
DEVICE_VAR = "MMM_DEVICE"  # the torch device type the ranks use (cuda, xpu, cpu)
# The straggler watch (runtime/stragglers.py): "EVERY,CHECKS,OF_MEDIAN,ACTION" (name, leave)
STRAGGLERS_VAR = "MMM_ORCH_STRAGGLERS"
BACKEND_VAR = "MMM_BACKEND"  # the collective backend (nccl, xccl, gloo)
# "1": the launcher binds one device to each rank, so a rank sees only its own (as device 0)
DEVICE_PER_RANK_VAR = "MMM_DEVICE_PER_RANK"
# How long a relaunched run waits for the run directory's lock held by the ranks of the launch
# that ended (seconds; failover sets it, runtime/loop.py waits).
RUN_LOCK_WAIT_VAR = "MMM_RUN_LOCK_WAIT"
CHECKPOINTS_DIR = "checkpoints"  # in the run directory: step-N/ and `latest`
TENSORBOARD_DIR = "tensorboard"  # in the run directory: TensorBoard's event files
WANDB_DIR = "wandb"  # in the run directory: W&B's run-*/offline-run-*
PROFILE_DIR = "profile"  # in the run directory: one torch.profiler trace per profiled rank
# Your own code's --profile, --profile-steps and --profile-ranks (runtime.profile_window reads them)
PROFILE_VAR = "MMM_ORCH_PROFILE"
PROFILE_STEPS_VAR = "MMM_ORCH_PROFILE_STEPS"
PROFILE_RANKS_VAR = "MMM_ORCH_PROFILE_RANKS"
PROFILE_RANGE = "mmm:"  # the prefix of the named ranges of a step in a trace (runtime/profiling.py)
PROFILE_PHASES = ("data", "forward", "backward", "optimizer")  # a step's ranges, in order


# A facility's profiler (`--profile nsys`, machines/*.yaml `profilers:`): the job exports its
# words (shell-quoted) and how the trainers bound the window; the launch starts every rank
# through injob/facility_profiler.py, which puts where the rank's output goes in place of {output} (a
# file name without its suffix, the tool adds one) or {output_dir} (a directory of the rank's).
PROFILER_VAR = "MMM_ORCH_PROFILER"
PROFILE_WINDOW_VAR = "MMM_ORCH_PROFILE_WINDOW"
PROFILER_OUTPUT = "{output}"
PROFILER_OUTPUT_DIR = "{output_dir}"
# How a trainer opens and closes the window for the profiler around it: the CUDA profiler API
# (nsys --capture-range=cudaProfilerApi), unitrace's PTI_ENABLE_COLLECTION (--conditional-
# collection), roctxProfilerResume/Pause (rocprofv3 --selected-regions), or not at all.
PROFILE_WINDOWS = ("cuda-profiler-api", "pti-collection", "roctx", "none")


def profile_output_name(host: str, rank: int) -> str:
    """What a profiled rank's files are named by, in the run's PROFILE_DIR: host and rank."""
    return f"{host}_rank{rank}"


def profile_trace_name(host: str, rank: int) -> str:
    """A rank's trace: TensorBoard's profiler plugin reads *.pt.trace.json, its worker named by
    what comes before."""
    return f"{profile_output_name(host, rank)}.pt.trace.json"


PROFILE_TRACE = re.compile(r"(?P<host>.+)_rank(?P<rank>\d+)\.pt\.trace\.json")  # its name, read


LATEST_CHECKPOINT = "latest"  # names the newest complete step-N (the chain reads it)

# -- in-job programs (`python -m ...` lines of the job script) ----------------------------------
MODULES = MappingProxyType(
    {
        "watchdog": "mmm_orch.injob.watchdog",
        "failover": "mmm_orch.injob.failover",
        "chain": "mmm_orch.injob.chain",
        "rendezvous": "mmm_orch.injob.rendezvous",
        "profiled": "mmm_orch.injob.facility_profiler",
        "screen": "mmm_orch.injob.screen",
    }
)
# Their options, by the names the templates use (`job.option.step_timeout`); the programs'
# parsers take the same spellings from here.
OPTIONS = MappingProxyType(
    {
        # the watchdog's, which failover passes on to it
        "first_step_timeout": "--first-step-timeout",
        "step_timeout": "--step-timeout",
        "grace": "--grace",
        "walltime_end": "--walltime-end",
        "margin": "--margin",
        "stop_signal": "--stop-signal",
        "progress": "--progress",
        # failover's own
        "dir": "--dir",
        "machine": "--machine",
        "active": "--active",
        "host_addr": "--host-addr",
        "attempts": "--attempts",
        "node_arg": "--node-arg",
        "avoid": "--avoid",
        "resume_args": "--resume-args",
        # the screen's
        "seconds": "--seconds",
        "of_median": "--of-median",
        "of_peak": "--of-peak",
        "peak_gflops": "--peak-gflops",
        "on_fail": "--on-fail",
        "device": "--device",
        "devices": "--devices",
        "per_node": "--per-node",
        "link_seconds": "--link-seconds",
        # the chain's
        "chain": "--chain",
        "link": "--link",
        "exit_code": "--exit-code",
    }
)

# -- markers: the start of a line a job prints ---------------------------------------------------
JOB_START = f"{PREFIX} job_start="  # =EPOCH host=HOST job=ID   (the script)
STAGE_START = f"{PREFIX} stage_start="  # =EPOCH                     (the script)
STAGE_END = f"{PREFIX} stage_end="  # =EPOCH                     (the script)
SETUP_FAILED = f"{PREFIX} setup_failed: "  # exit=RC line=LINE       (the script)
LAUNCH = f"{PREFIX} launch: "  # the launch line            (the script)
LAUNCH_START = f"{PREFIX} launch_start="  # =EPOCH ranks=R nodes=N     (the script)
LAUNCH_END = f"{PREFIX} launch_end="  # =EPOCH exit_code=RC        (the script)
SIGTERM_RECEIVED = f"{PREFIX} job script: SIGTERM received"  # waiting for the launch (the script)
STOPPED = f"{PREFIX} job script: stopped by SIGTERM"  # : exit 143          (the script)
FIRST_STEP = f"{PREFIX} first_step="  # =EPOCH step=S at=DATE      (the trainers)
RESUMED_STEP = f"{PREFIX} resumed_step="  # =EPOCH step=S at=DATE      (the trainers)
WALLTIME_STOP = f"{PREFIX} walltime_stop="  # =EPOCH walltime in Ns: ... (the watchdog)
HUNG = f"{PREFIX} hung:"  # what; last_step=...        (the watchdog)
CHECKPOINTED = f"{PREFIX} checkpointed before the walltime:"  # step=S ...     (the watchdog)
WATCHDOG = f"{PREFIX} watchdog:"  # what the watchdog saw      (the watchdog)
RENDEZVOUS = f"{PREFIX} rendezvous:"  # a port was taken: relaunch (the watchdog)
ATTEMPT = f"{PREFIX} attempt"  # =K/N at=EPOCH active=...; " K/N: verdict"
RETIRED = f"{PREFIX} failover: retired"  # NODE at=EPOCH (evidence)   (failover)
FAILOVER = f"{PREFIX} failover:"  # other failover news        (failover)
SCREEN = f"{PREFIX} screen:"  # NODE FIGURES: VERDICT; the cost (the screen)
STRAGGLER = f"{PREFIX} straggler:"  # rank R on NODE: ...[; leaving NODE: ...] (the trainers)
STRAGGLER_LEAVING = "leaving"  # in a STRAGGLER line: the run saves and goes on without NODE
CHAIN = f"{PREFIX} chain:"  # link K/N ...               (the chain)
CHAIN_SKIPPED = " skipped: "  # in a CHAIN line: this link did not run
CHAIN_BUDGET = "budget: "  # a chain stopped by its --max-node-hours says so first
# The trainers' lines: a checkpoint saved (runtime/metrics.py prints an event as `[name] ` and its
# fields, step first), and dist_check's summary.
CHECKPOINT_EVENT = "checkpoint"
CHECKPOINT_SAVED = f"[{CHECKPOINT_EVENT}] step="  # S path=... save_s=SECONDS
DIST_CHECK_JSON = "[dist_check] json "  # {"pass": ..., "allreduce": [...]}

# A module system's error line (Lmod; Environment Modules 4 and later; 3.2), which a setup line's
# exit status may not carry (Modules 3.2's `module` returns 0 on a failed load): the job script
# (grep -E) and `machines check` both read it. POSIX ERE and Python alike.
MODULE_ERROR = (
    r"^(Lmod has detected the following error|ERROR: |ModuleCmd_[A-Za-z]+\.c\([0-9]+\):ERROR:)"
)

# What the templates write, by the names they use (`job.marker.launch_start`).
_TEMPLATE_MARKERS = {
    "job_start": JOB_START,
    "stage_start": STAGE_START,
    "stage_end": STAGE_END,
    "setup_failed": SETUP_FAILED,
    "launch": LAUNCH,
    "launch_start": LAUNCH_START,
    "launch_end": LAUNCH_END,
    "sigterm_received": SIGTERM_RECEIVED,
    "stopped": STOPPED,
}
FOR_TEMPLATES = MappingProxyType(
    {
        "marker": MappingProxyType(_TEMPLATE_MARKERS),
        "exit": MappingProxyType(
            {
                "chain_skip": EXIT_CHAIN_SKIP,
                "stopped": EXIT_STOPPED_BY_TERM,
                "hung": EXIT_HUNG,
                "checkpointed": EXIT_CHECKPOINTED,
                "screened_out": EXIT_SCREENED_OUT,
            }
        ),
        "file": MappingProxyType({"nodes": NODES_FILE}),
        "pattern": MappingProxyType({"module_error": MODULE_ERROR}),
        "module": MODULES,
        "option": OPTIONS,
        "var": MappingProxyType(
            {
                "run_dir": RUN_DIR_VAR,
                "resume": RESUME_VAR,
                "allow_fresh": ALLOW_FRESH_VAR,
                "job_end": JOB_END_VAR,
                "stragglers": STRAGGLERS_VAR,
                "profile": PROFILE_VAR,
                "profile_ranks": PROFILE_RANKS_VAR,
                "profiler": PROFILER_VAR,
                "profile_window": PROFILE_WINDOW_VAR,
            }
        ),
    }
)

# -- readers --------------------------------------------------------------------------------------
# An epoch time as the markers print it; longer numbers are a garbled or forged line.
_EPOCH = r"(\d{1,12}(?:\.\d{1,9})?)(?![\d.])"


def _after(marker: str, rest: str = "", flags: int = 0) -> re.Pattern[str]:
    return re.compile(re.escape(marker) + rest, flags)


# Events a job has once: (epoch, then what else the line says).
ONCE = MappingProxyType(
    {
        "job_start": _after(JOB_START, _EPOCH + r"(?: host=(\S+))?"),
        "launch_start": _after(LAUNCH_START, _EPOCH + r"(?: ranks=(\d{1,9}) nodes=(\d{1,9}))?"),
        "first_step": _after(FIRST_STEP, _EPOCH),
        "launch_end": _after(LAUNCH_END, _EPOCH + r"(?: exit_code=(-?\d{1,9}))?"),
        "walltime_stop": _after(WALLTIME_STOP, _EPOCH),
        "stage_start": _after(STAGE_START, _EPOCH),
        "stage_end": _after(STAGE_END, _EPOCH),
    }
)
# Events that can happen several times in one job: failover attempts, nodes retired, resumes.
REPEATED = MappingProxyType(
    {
        "attempt": _after(ATTEMPT, r"=(\d{1,9}/\d{1,9}) at=" + _EPOCH + r" active=(\S+)"),
        "retired": _after(RETIRED, r" (\S+) at=" + _EPOCH),
        "resumed": _after(RESUMED_STEP, _EPOCH + r" step=(\d{1,18})"),
    }
)
# A setup line that failed: its exit status and the line (the module system's words are above).
SETUP_FAILURE = _after(SETUP_FAILED, r"exit=(\d{1,3}) line=(.*)$")
JOB_ID = _after(JOB_START, r"\S+ host=\S+ job=(\S+)")  # the scheduler's id, "local" on none
JOB_HOST = re.compile(
    r"(?:" + re.escape(JOB_START) + r"\S+ host=|Job started at: \S+ on )"
    r"(?P<host>\S+)"
)
SAVED = re.compile(r"^" + re.escape(CHECKPOINT_SAVED) + r"(\d+) ")
SAVED_BYTES = re.compile(
    rb"^" + re.escape(CHECKPOINT_SAVED.encode()) + rb"(\d+) .*save_s=([0-9.eE+-]+)"
)
STEP_BYTES = re.compile(rb"(?:^|[\s,\]])step=(\d+)")  # any step line of a trainer


def link_id_file(link: int) -> str:
    return f"link-{link}.id"


def checkpoint_name(step: int) -> str:
    """A checkpoint's directory in CHECKPOINTS_DIR, as LATEST_CHECKPOINT names it."""
    return f"step-{step}"


def checkpoint_step(name: str) -> int | None:
    """The step of a checkpoint named by checkpoint_name, or None for any other name."""
    digits = name.strip().removeprefix("step-")
    number = name.strip().startswith("step-") and digits.isascii() and digits.isdigit()
    return int(digits) if number else None  # ("²" is a digit to isdigit, not to int)


def point_latest(run_dir: str | Path, step: int) -> None:
    """Name step-`step` the run's newest complete checkpoint (atomically: a reader sees the old
    name or the new one)."""
    write_atomically(Path(run_dir) / CHECKPOINTS_DIR / LATEST_CHECKPOINT, checkpoint_name(step))


def latest_step(run_dir: str | Path) -> int | None:
    """The step of the run's newest complete checkpoint, or None (also where `latest` is no
    small regular file: a FIFO or a link to /dev/zero is not waited on nor read without end)."""
    try:
        fd = os.open(
            Path(run_dir) / CHECKPOINTS_DIR / LATEST_CHECKPOINT, os.O_RDONLY | os.O_NONBLOCK
        )
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        text = os.read(fd, 64).decode()
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)
    step = checkpoint_step(text)
    return step if step is not None and len(text) < 64 else None


def say(marker: str, text: str = "") -> None:
    """Print a marker line at once: the log is read while the job runs."""
    print(f"{marker}{text}", flush=True)


def write_atomically(path: str | Path, text: str) -> None:
    """`text` as the whole of `path`: a reader sees the old file or the new one, never a part."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(text)
    partial.replace(path)


def charge(
    nodes: float,
    seconds: float,
    *,
    walltime: float,
    charged_for: str,
    minimum: float,
    factor: float,
    share: float = 1.0,
) -> float:
    """The charge, in the facility's unit, of `nodes` held (`share` of each) for `seconds`: for
    the walltime asked for instead where the facility charges that, at least `minimum` seconds,
    times the charge factor. Here, not in planning/, because a chain's links price themselves
    with it inside the job (files.ChainBudget)."""
    if charged_for == "walltime":
        seconds = walltime
    return nodes * share * max(seconds, minimum) / 3600 * factor
