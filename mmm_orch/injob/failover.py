"""Failover inside a job: the allocation holds spare nodes, and when a launch fails because a node
did, the launch starts again without that node, on a spare, from the last checkpoint, in the same
job (no new wait in the queue).

    python -m mmm_orch.injob.failover --dir JOB_DIR --machine MACHINE --active 2 \\
        --node-arg '--nodelist={nodelist}' [--avoid n7] [--attempts 3] \\
        --resume-args '--resume --allow-fresh' [watchdog options] -- 'srun @NODES@ ... python -m ...'

JOB_DIR holds nodes.txt (the job's nodes, in order) and, from `mmm-orch submit`, failures.json
(the signatures below, as they were when the job was submitted; without it the machine's profile
is read here). The loop writes active-hosts.txt (the launcher's host file), failover.json
(where it stands, for `mmm-orch status`) and, at its end, the job's outcome file beside them.

Each attempt runs under the watchdog (hangs, the walltime stop) and is then classified from its
exit code, the watchdog's verdict and the failure signatures (the machine's and the common ones):

    success (exit 0) ............................................. stop: done
    the scheduler stopped the job (SIGTERM, SIGINT: qdel, scancel) stop
    a straggler the trainers left, having saved (exit 75) ........ retire it, retry
    saved before the walltime (exit 75) .......................... stop: resumable
    the walltime is (nearly) spent ............................... stop
    a rank killed on a named node (srun "n2: tasks 2-3: Killed", Hydra "RUNNING AT x" with
      signal 9, PALS "x: shepherd died from signal 9", PALS "Couldn't forward RPC launch ...
      to child x": the child, not the reporting parent) ......... node fault: retire x, retry
    a hang the watchdog ended (exit 124) ......................... hang: retire a named node, else
                                                                   rotate one node out (blind), retry
    ranks killed (SIGKILL), no node named ........................ node fault: blind rotation, retry
    a failure before any step (an exception, a refusal, a bad option, a missing file) .. stop:
                                                                   the code or the request
    an exception after steps, no node named ...................... stop: the code
    no spare left / attempts used up ............................. stop, saying which

Retired nodes are printed as `[mmm-orch] failover: retired NODE (evidence)`, so that mmm-orch
remembers them for later jobs on this machine. A failure inside this loop ends the job with its
own message (exit 70), never silently. Standard library and mmm_orch only: it runs in the job's
own Python.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path

from mmm_orch.injob import files, protocol, rendezvous, watchdog
from mmm_orch.injob.deadline import Deadline
from mmm_orch.injob.diagnose import TEARDOWN, diagnose
from mmm_orch.injob.protocol import NODES_TOKEN

_LEAVING = re.compile(
    re.escape(protocol.STRAGGLER) + r".*; " + protocol.STRAGGLER_LEAVING + r" (\S+):"
)
_KILLED = re.compile(r"\b(Killed|KILLED BY SIGNAL: 9|EXIT CODE: (9|137)|signal 9)\b")
# A relaunch waits up to this long for the ranks of the attempt before to let go of the run
# directory: the launcher may return before the scheduler has killed them all (a stopped rank
# goes only at Slurm's KillWait, 30 s by default; PBS's kill_delay is 10 s).
RELAUNCH_LOCK_WAIT_S = 120


@dataclass
class Verdict:
    kind: str  # success, stopped, checkpointed, walltime, node, hang, start, code
    reason: str
    nodes: tuple[str, ...] = ()
    retry: bool = False


def load_signatures(job_dir: Path, machine: str) -> list:
    """The failure signatures written beside the job at submission, as plain objects; without
    that file (a script from `mmm-orch render`), the machine's profile and the common ones, read
    in a process of their own: loading profiles takes pydantic, which the job's Python may lack."""
    path = job_dir / protocol.FAILURES_FILE
    if path.exists():
        text = path.read_text()
    else:
        text = subprocess.run(
            [sys.executable, "-m", "mmm_orch.config.failures", machine],
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        ).stdout
    defaults = {
        "fallout": False,
        "catch_all": False,
        "consequence": False,
        "node_fault": False,
        "end": None,
        "meaning": "",
        "fix": "",
        "source": "",
    }
    return [types.SimpleNamespace(**{**defaults, **entry}) for entry in json.loads(text)]


def classify(
    launch: watchdog.Launch,
    signatures: list,
    active: list[str],
    walltime_end: float | None,
    margin: float,
) -> Verdict:
    if launch.code == 0:
        return Verdict("success", "the launch finished")
    stops = [signal.Signals(s).name for s in launch.received if s in watchdog.STOPS]
    if stops:
        return Verdict(
            "stopped", f"the scheduler stopped the job ({stops[0]}: cancelled, or the walltime)"
        )
    left = next((m[1] for line in launch.lines if (m := _LEAVING.search(line))), None)
    if left is not None and left in active:  # it saved: the next attempt resumes without it
        return Verdict(
            files.RETIRED_STRAGGLER,
            f"{left} straggled: the run saved to go on without it",
            (left,),
            True,
        )
    if launch.checkpointed or launch.code == protocol.EXIT_CHECKPOINTED:
        return Verdict("checkpointed", "saved a checkpoint before the walltime")
    if walltime_end is not None and Deadline(walltime_end, margin).spent():
        return Verdict("walltime", f"the walltime is spent (exit {launch.code})")
    lines = list(launch.lines)
    # The launcher's report of the first rank it lost comes before its own teardown of the rest,
    # and before the ranks the watchdog's stop of a hang killed.
    cut = next(
        (
            i
            for i, line in enumerate(lines)
            if TEARDOWN.search(line) or line.startswith(protocol.HUNG)
        ),
        len(lines) - 1,
    )
    cause = lines[: cut + 1]
    first = diagnose("\n".join(cause), signatures).first
    # Logs and node lists may name a node differently (x1.hsn.cm... and x1.hostmgmt...).
    named = {short(node): node for node in active}.get(short(first.host or "")) if first else None
    if first is not None and first.signature.node_fault and named:
        return Verdict(
            files.RETIRED_LOST,
            f"{named} lost its ranks: {first.line.strip(' =')[:160]}",
            (named,),
            True,
        )
    if launch.hung:
        return Verdict(files.RETIRED_HUNG, "the watchdog ended a hang; no node named", (), True)
    what = f"{first.signature.name}: {first.line[:160]}" if first else f"exit {launch.code}"
    # Not the launch's exit code: srun returns 143 when its own teardown terminated the others.
    if any(_KILLED.search(line) for line in cause):
        return Verdict(
            files.RETIRED_LOST, f"ranks were killed (exit {launch.code}); no node named", (), True
        )
    if launch.last_step is None:
        return Verdict("start", f"failed before its first step ({what})")
    return Verdict("code", f"failed after step {launch.last_step} ({what})")


def run(args: argparse.Namespace) -> int:
    signatures = load_signatures(args.dir, args.machine)
    active, spares = _placed(args)
    attempts = args.attempts or len(spares) + 1
    retired: list[files.RetiredNode] = []
    stop_signal = signal.Signals[f"SIG{args.stop_signal}"]
    last_step = saved = None  # over all attempts, for the outcome file
    for attempt in range(1, attempts + 1):
        line = _attempt_line(args, attempt, active)
        protocol.say(
            protocol.ATTEMPT,
            f"={attempt}/{attempts} at={time.time():.3f} "
            f"active={','.join(active)} spares={','.join(spares) or 'none'}",
        )
        state = files.FailoverState(attempt, attempts, tuple(active), tuple(spares), tuple(retired))
        report(args, state)
        launch = watchdog.run_bound(
            line,
            args.first_step_timeout,
            args.step_timeout,
            args.grace,
            args.walltime_end,
            args.margin,
            stop_signal,
            progress=args.progress,
        )
        last_step = launch.last_step if launch.last_step is not None else last_step
        saved = launch.saved_step if launch.saved_step is not None else saved
        verdict = classify(launch, signatures, active, args.walltime_end, args.margin)
        code = launch.code if launch.code is not None else 1
        head = f" {attempt}/{attempts}: {verdict.kind}: {verdict.reason}"  # after ATTEMPT
        if not verdict.retry:
            protocol.say(protocol.ATTEMPT, head)
            return _end(args, state, verdict, verdict.reason, launch, code, (last_step, saved))
        out = list(verdict.nodes)
        blind = not out
        if blind:  # nothing names a node: take one out anyway, and say it is a guess
            out = [active[-1]]
        stopping = len(spares) < len(out) or attempt == attempts
        # A node that failed is retired (and remembered) even when no attempt is left; a guess
        # is rotated out only when there is a next attempt to make on a spare.
        for node in [] if stopping and blind else out:
            evidence = f"{'blind rotation: ' if blind else ''}{verdict.reason}"
            protocol.say(protocol.RETIRED, f" {node} at={time.time():.3f} ({evidence})")
            retired.append(files.RetiredNode(node, evidence, blind, attempt, verdict.kind))
        if stopping:
            why = "no spare node left" if len(spares) < len(out) else "attempts used up"
            protocol.say(protocol.ATTEMPT, f"{head}; {why}: stopping")
            return _end(
                args,
                dataclasses.replace(state, retired=tuple(retired)),
                verdict,
                f"{verdict.reason}; {why}",
                launch,
                code or 1,
                (last_step, saved),
            )
        active = [spares.pop(0) if n in out else n for n in active]
        protocol.say(
            protocol.ATTEMPT, f"{head}; relaunching on {','.join(active)} from the last checkpoint"
        )
    raise AssertionError("unreachable: the last attempt always returns")


def _placed(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The nodes to launch on first and the spares, known-bad nodes last."""
    allocated = [n for n in (args.dir / protocol.NODES_FILE).read_text().split() if n]
    if len(allocated) < args.active:
        raise ValueError(
            f"the job has {len(allocated)} nodes, fewer than the {args.active} to "
            f"launch on: {allocated}"
        )
    avoid = {n for n in args.avoid.split(",") if n}
    # Nodes the screen left out are not used at all (it stopped the job if too few were left);
    # nodes known to be bad go last: spares, used only when nothing else is left.
    allocated = [n for n in allocated if n not in screened_out(args.dir)]
    ordered = [n for n in allocated if n not in avoid] + [n for n in allocated if n in avoid]
    active, spares = ordered[: args.active], ordered[args.active :]
    if avoid & set(active):
        protocol.say(
            protocol.FAILOVER,
            " launching on known-bad nodes, no others left: "
            f"{','.join(sorted(avoid & set(active)))}",
        )
    return active, spares


def screened_out(job_dir: Path) -> set[str]:
    """The nodes the screen before the launch left out (SCREEN_FILE; none without one)."""
    try:
        result = files.ScreenResult.from_json((job_dir / protocol.SCREEN_FILE).read_bytes())
    except (OSError, files.ProtocolFileError):
        return set()
    return {node.node for node in result.left_out} if result.verdict == "left out" else set()


def _attempt_line(args: argparse.Namespace, attempt: int, active: list[str]) -> str:
    """The launch line of an attempt on `active`, and its environment."""
    line = args.command.replace(NODES_TOKEN, node_arg(args, active))
    # Rank 0 runs on the first active node, and each relaunch rendezvous on a port nobody
    # holds: ranks of the attempt before may still hold the old one while they are torn down.
    os.environ["MASTER_ADDR"] = args.host_addr.format(node=active[0], short=short(active[0]))
    if attempt > 1:
        os.environ["MASTER_PORT"] = str(rendezvous.free_port())
    if attempt > 1:  # from the last checkpoint: a trainer by its options, a command by
        line = f"{line} {args.resume_args}".rstrip()  # the runtime's variables
        os.environ.update(
            {
                protocol.RESUME_VAR: "1",
                protocol.ALLOW_FRESH_VAR: "1",
                protocol.RUN_LOCK_WAIT_VAR: str(RELAUNCH_LOCK_WAIT_S),
            }
        )
    return line


# The outcome file's words for the last attempt's verdict (any other: failed).
_WHY = {
    "success": files.WHY_COMPLETED,
    "stopped": files.WHY_STOPPED,
    "checkpointed": files.WHY_CHECKPOINTED,
    "hang": files.WHY_HUNG,
}


def _end(
    args: argparse.Namespace,
    state: files.FailoverState,
    verdict: Verdict,
    reason: str,
    launch: watchdog.Launch,
    code: int,
    steps: tuple[int | None, int | None],
) -> int:
    """The loop's end: failover.json with the verdict, the job's outcome file, the exit code."""
    report(args, dataclasses.replace(state, verdict=verdict.kind, reason=reason))
    why = _WHY.get(verdict.kind, files.WHY_FAILED)
    detail = launch.hung_reason if why == files.WHY_HUNG and launch.hung_reason else reason
    last_step, saved = steps
    files.write_outcome(
        files.Outcome(code, why, detail, last_step, watchdog.resumable_step(saved), time.time()),
        args.dir,
    )
    return code


def short(node: str) -> str:
    return node.split(".", 1)[0]


def report(args: argparse.Namespace, state: files.FailoverState) -> None:
    """failover.json beside the job: where the failover stands, for `mmm-orch status` (and the
    nodes to remember as bad)."""
    protocol.write_atomically(args.dir / protocol.FAILOVER_FILE, state.to_json())


def node_arg(args: argparse.Namespace, active: list[str]) -> str:
    """The launcher's words for "only these nodes": a node list, or a host file it reads. Both are
    shell words of the launch line: the job directory may hold a space, a node name is the
    scheduler's but still only data."""
    hostfile = args.dir / protocol.ACTIVE_HOSTS_FILE
    hostfile.write_text("".join(f"{node}\n" for node in active))
    return args.node_arg.format(
        nodelist=shlex.quote(",".join(active)), hostfile=shlex.quote(str(hostfile))
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mmm_orch.injob.failover", description=(__doc__ or "").split("\n\n")[0]
    )
    option = protocol.OPTIONS
    parser.add_argument(
        option["dir"],
        type=Path,
        required=True,
        help=f"the job's directory: {protocol.NODES_FILE}, "
        f"{protocol.FAILURES_FILE}; {protocol.FAILOVER_FILE} goes there",
    )
    parser.add_argument(
        option["machine"],
        required=True,
        help=f"whose failure signatures, without {protocol.FAILURES_FILE}",
    )
    parser.add_argument(option["active"], type=int, required=True, help="nodes a launch runs on")
    parser.add_argument(
        option["host_addr"],
        default="{node}",
        help="a node's address from its name ({node}, {short}): MASTER_ADDR",
    )
    parser.add_argument(
        option["attempts"], type=int, default=0, help="at most (default: spares + 1)"
    )
    parser.add_argument(
        option["node_arg"],
        required=True,
        help="launcher words for the active nodes ({nodelist}, {hostfile})",
    )
    parser.add_argument(option["avoid"], default="", help="nodes known to be bad, comma-separated")
    parser.add_argument(
        option["resume_args"], default="", help="added to the trainer's on a relaunch"
    )
    watchdog.add_options(parser)  # for the watchdog of each attempt
    parser.add_argument("command", nargs=argparse.REMAINDER)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.command = " ".join(args.command[1:] if args.command[:1] == ["--"] else args.command)
    try:
        return run(args)
    except Exception as exc:  # noqa: BLE001 - the loop meant to recover must not fail silently
        what = f"internal error, the job ends: {type(exc).__name__}: {exc}"
        protocol.say(protocol.FAILOVER, f" {what}")
        files.write_outcome(
            files.Outcome(
                protocol.EXIT_INTERNAL_ERROR,
                files.WHY_FAILED,
                f"failover: {what}",
                ended_at=time.time(),
            ),
            args.dir,
        )
        return protocol.EXIT_INTERNAL_ERROR


if __name__ == "__main__":
    sys.exit(main())
