"""The llama3 trainer with every step lasting at least MMM_TEST_STEP_S seconds (a step that ends
sooner waits out the rest). The chain test runs it: its training then needs the same number of
links on a host loaded tenfold as on a quiet one, where a fixed number of compute-bound steps
needs more links the slower the host (up to the chain's end). The trainer itself is unchanged:
its steps, checkpoints, saves before the walltime and resumes are the ones under test."""

if __name__ == "__main__":  # as the trainer's own entry: a stop during startup waits for step 1
    from mmm_orch.runtime import stop
    stop.catch()

import os
import time

from mmm_orch.runtime import dist as runtime_dist
from mmm_orch.runtime import loop
from mmm_orch.trainers import llama3

STEP_S = float(os.environ["MMM_TEST_STEP_S"])
_start, _stop = loop.StepTimer.start, loop.StepTimer.stop


def paced_start(timer: loop.StepTimer) -> None:
    _start(timer)
    timer.paced_until = time.monotonic() + STEP_S


def paced_stop(timer: loop.StepTimer) -> dict[str, float]:
    time.sleep(max(0.0, timer.paced_until - time.monotonic()))
    return _stop(timer)


loop.StepTimer.start, loop.StepTimer.stop = paced_start, paced_stop

if __name__ == "__main__":
    runtime_dist.run_main(llama3.main)
