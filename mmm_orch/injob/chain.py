"""A chain of jobs that carries one training run across walltimes, run inside the jobs themselves
so that it needs no process of ours outside them (the laptop may be closed).

mmm-orch writes the chain's state file (chain.json, in the chain's directory beside the jobs:
how many links, the run directory, the cancel command), then submits every link at once, link
k+1 depending on link k through the scheduler (`afterany`), writing each link's id beside it
(protocol.link_id_file: written once, so nothing races the jobs' own updates). Each link's script runs

    python -m mmm_orch.injob.chain begin --chain FILE --link K     before its launch
    python -m mmm_orch.injob.chain end --chain FILE --link K --exit-code RC    after it

`begin` skips the link (exit protocol.EXIT_CHAIN_SKIP) when the chain has ended, or when its
whole walltime could pass the chain's budget (--max-node-hours: the links' nodes for the time
from their start to their end), and ends the chain when the link
before made no progress (its checkpoint is no newer than the step it started from: a run that
crashes at start must not burn a week of allocation). `end` ends the chain when the training
finished (the trainer exited 0 at its last step), when this link made no progress, or when the
next link could pass the budget, and then cancels the links still waiting. A link that does not
run says why in the log and in its job's outcome file. Standard library only: it runs in the
job's own Python.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mmm_orch.injob import files, protocol
from mmm_orch.injob.files import ChainState, LinkProgress


@dataclass
class Held:
    """The chain's state while its lock is held: what is put here is written back."""

    state: ChainState


@contextlib.contextmanager
def locked(path: Path) -> Iterator[Held]:
    """The chain's state, read and written back under an exclusive lock."""
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        held = Held(ChainState.from_json(path.read_bytes()))
        yield held
        protocol.write_atomically(path, held.state.to_json())


def say(text: str) -> None:
    protocol.say(protocol.CHAIN, f" {text}")


def link_ids(path: Path) -> dict[int, str]:
    """The scheduler ids of the links submitted so far (link-K.id beside chain.json)."""
    ids = {}
    for file in path.parent.iterdir():
        if match := protocol.LINK_ID.fullmatch(file.name):
            with contextlib.suppress(OSError):
                ids[int(match[1])] = file.read_text().strip()
    return ids


def _stop(path: Path, held: Held, status: str, reason: str, after: int) -> None:
    """End the chain and cancel every link after `after` that the scheduler still holds. The
    chain's end is written first: were this process killed while cancelling, the links left
    would still skip."""
    held.state = dataclasses.replace(held.state, status=status, reason=reason)
    protocol.write_atomically(path, held.state.to_json())
    waiting = [native_id for index, native_id in sorted(link_ids(path).items()) if index > after]
    for native_id in waiting:
        subprocess.run([*held.state.cancel, native_id], capture_output=True, timeout=60)
    say(
        f"{'finished' if status == 'finished' else 'stopped'}: {reason}"
        + (f"; cancelled the links still waiting ({', '.join(waiting)})" if waiting else "")
    )


def _skip(link: int, total: int, why: str) -> int:
    """This link does not run: said in the log and in the job's outcome file."""
    text = f"link {link}/{total}{protocol.CHAIN_SKIPPED}{why}"
    say(text)
    files.write_outcome(
        files.Outcome(protocol.EXIT_CHAIN_SKIP, files.WHY_CHAIN_SKIPPED, text, ended_at=time.time())
    )
    return protocol.EXIT_CHAIN_SKIP


def begin(path: Path, link: int) -> int:
    with locked(path) as held:
        state = held.state
        total = state.links
        if state.status != "running":
            return _skip(link, total, f"the chain {state.status} ({state.reason})")
        step = protocol.latest_step(state.run_dir)
        before = state.progress.get(link - 1)
        if before is not None and before.ended is None and (step or 0) <= before.start_step:
            # The link before died without saying how it ended (killed at its walltime with no
            # checkpoint, a lost node): judge it by its checkpoint.
            why = (
                f"link {link - 1} made no progress (it started at step {before.start_step}; "
                f"the newest checkpoint is {f'step {step}' if step is not None else 'none'})"
            )
            # Only the links after this one are cancelled: this one skips (cancelling its own
            # job would kill this process while it cancels the rest).
            _stop(path, held, "stopped", why, link)
            return _skip(link, total, why)
        if over := _over_budget(state, link):
            _stop(path, held, "stopped", over, link)
            return _skip(link, total, over)
        held.state = dataclasses.replace(
            state,
            progress={
                **state.progress,
                link: LinkProgress(start_step=step or 0, started=time.time()),
            },
        )
        say(f"link {link}/{total} starts at step {step or 0}")
    return 0


def _over_budget(state: ChainState, link: int) -> str:
    """Why link `link` must not start: the links before it spent so much (their nodes for the
    time from their start to their end, priced by protocol.charge as plans are) that this one,
    running its whole walltime, could pass the chain's budget (--max-node-hours, or what the
    account's budget left); '' when it fits."""
    budget = state.budget
    if budget is None:
        return ""
    now = time.time()
    # A link killed before its end was written held its nodes at most its walltime.
    spent = sum(
        budget.charge(
            min(entry.ended if entry.ended is not None else now, entry.started + budget.walltime)
            - entry.started
        )
        for entry in state.progress.values()
        if entry.started is not None
    )
    most = budget.charge(budget.walltime)
    if spent + most <= budget.limit:
        return ""
    return (
        f"{protocol.CHAIN_BUDGET}{_amount(budget.limit)} {budget.unit} reached (links "
        f"1-{link - 1} used {_amount(spent)}; link {link} could take {_amount(most)} more)"
    )


def _amount(value: float) -> str:
    return f"{value:,.2f}" if value >= 10 else f"{value:.3g}"


def end(path: Path, link: int, code: int) -> int:
    with locked(path) as held:
        total = held.state.links
        step = protocol.latest_step(held.state.run_dir)
        progress = dataclasses.replace(
            held.state.progress.get(link, LinkProgress(start_step=0)),
            end_step=step,
            exit_code=code,
            ended=time.time(),
        )
        held.state = state = dataclasses.replace(
            held.state, progress={**held.state.progress, link: progress}
        )
        if state.status != "running":
            return code
        if code == 0:
            _stop(path, held, "finished", f"the training finished in link {link}/{total}", link)
        elif step is None or step <= progress.start_step:
            _stop(
                path,
                held,
                "stopped",
                f"link {link} made no progress (exit {code}; no "
                f"checkpoint newer than step {progress.start_step})",
                link,
            )
        elif link < total and (over := _over_budget(state, link + 1)):
            _stop(path, held, "stopped", over, link)  # the next link never starts: no charge
        elif link == total:
            held.state = dataclasses.replace(
                state, status="stopped", reason=f"all {total} links ran; not finished"
            )
            say(
                f"link {link}/{total} saved step {step}; the chain is used up before the end of "
                "the training: rerun the last link with --resume, or submit a longer --chain"
            )
        else:
            say(
                f"link {link}/{total} saved step {step} (started at {progress.start_step}); "
                f"link {link + 1} continues"
            )
    return code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mmm_orch.injob.chain", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("action", choices=["begin", "end"])
    parser.add_argument(protocol.OPTIONS["chain"], type=Path, required=True, metavar="FILE")
    parser.add_argument(protocol.OPTIONS["link"], type=int, required=True)
    parser.add_argument(protocol.OPTIONS["exit_code"], type=int, default=0)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.action == "begin":
            return begin(args.chain, args.link)
        return end(args.chain, args.link, args.exit_code)
    except files.ProtocolFileError as exc:  # written by the jobs: a clear line, no traceback
        say(f"link {args.link}: {exc}; the chain's state cannot be read")
        return 1


if __name__ == "__main__":
    sys.exit(main())
