"""One rank of a launch profiled with a facility's profiler (`--profile nsys`, `unitrace`, ...).

The job exports the profiler's words (protocol.PROFILER_VAR, from the machine's `profilers:`)
and the launch starts every rank as `python3 -m mmm_orch.injob.facility_profiler -- PROGRAM...`. A rank
chosen for profiling (--profile-ranks, by default local rank 0 of each node, as the trainers
choose) becomes the profiler running PROGRAM, its output named by host and rank in the run's
profile/ directory; any other rank becomes PROGRAM itself. Either way this process is replaced
(exec): signals, exit codes and the launcher's view of the rank are the program's.

Runs inside jobs: the standard library only.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

from mmm_orch.injob import protocol
from mmm_orch.injob.launch_env import LaunchEnvError, host_name, locate
from mmm_orch.injob.windows import ranks


def command(program: list[str], env: Mapping[str, str]) -> list[str]:
    """What this rank runs: PROGRAM under the profiler when the rank is a profiled one, else
    PROGRAM. ValueError when the job's profiler variables or launcher variables say nothing
    usable."""
    words = shlex.split(env.get(protocol.PROFILER_VAR, ""))
    if not words:
        raise ValueError(f"{protocol.PROFILER_VAR} is empty: the job names no profiler")
    launch = locate(env)
    chosen = ranks(env.get(protocol.PROFILE_RANKS_VAR, ""), launch.world_size)
    if not (launch.local_rank == 0 if chosen is None else launch.rank in chosen):
        return program
    run_dir = Path(env.get(protocol.RUN_DIR_VAR) or ".")
    output = (
        run_dir / protocol.PROFILE_DIR / protocol.profile_output_name(host_name(env), launch.rank)
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    if any(protocol.PROFILER_OUTPUT_DIR in word for word in words):
        output.mkdir(exist_ok=True)
    return [
        word.replace(protocol.PROFILER_OUTPUT_DIR, str(output)).replace(
            protocol.PROFILER_OUTPUT, str(output)
        )
        for word in words
    ] + program


def main(argv: list[str]) -> int:
    program = argv[1:] if argv[:1] == ["--"] else argv
    if not program:
        print(
            "usage: python -m mmm_orch.injob.facility_profiler -- PROGRAM [ARGS...]",
            file=sys.stderr,
        )
        return 2
    try:
        words = command(program, os.environ)
    except (ValueError, LaunchEnvError) as exc:
        print(f"mmm-orch profiled: {exc}", file=sys.stderr)
        return 2
    try:
        os.execvp(words[0], words)
    except OSError as exc:  # a profiler the job's environment does not have
        print(f"mmm-orch profiled: cannot run {words[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
