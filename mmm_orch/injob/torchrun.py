"""torchrun as the jobs mmm-orch starts use it: torch.distributed.run itself, ending the way a
rank ended rather than in a traceback of its own.

torchrun returns 1 for any failed worker and raises ChildFailedError, whose traceback and failure
table (the "Root Cause" box) follow the rank's own words in the job's log: a trainer's one-line
refusal (exit 2) became a page. Here the first failure is told in one line and its exit code is
the launch's (128 + the signal for a rank that was killed), which the watchdog passes on.

    python -m mmm_orch.injob.torchrun --standalone --nproc-per-node=2 -m mmm_orch.trainers.fsdp
"""

from __future__ import annotations

import sys


def run(argv: list[str] | None = None) -> int:
    # torch here, not at the import: the in-job modules import without it (the watchdog's job)
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main

    try:
        main(argv)
    except ChildFailedError as failed:
        rank, first = failed.get_first_failure()
        code = first.exitcode if first.exitcode >= 0 else 128 - first.exitcode
        how = f"exited with code {first.exitcode}" if first.exitcode >= 0 else "was killed"
        print(f"torchrun: rank {rank} {how} first: exit {code}", file=sys.stderr, flush=True)
        return code
    return 0


if __name__ == "__main__":
    sys.exit(run())
