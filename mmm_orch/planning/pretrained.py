"""A run that starts from pretrained weights (--init-from), checked before the queue: where
the checkpoint is readable here, its configuration and tensor shapes against the model the
run's options build, so that a mismatch is one line now rather than an exit 2 after the wait.
(The trainer checks again in the job, where the path is read for sure.)"""

from __future__ import annotations

import os
from typing import Any

from mmm_orch.config.workload import Workload
from mmm_orch.errors import MmmError, PretrainedError
from mmm_orch.planning import memory
from mmm_orch.pretrained import formats


def check_before_queue(
    workload: Workload, args: dict[str, Any], workdir: str | None, login_hosts
) -> None:
    """MmmError when --init-from names a checkpoint that cannot start this run. A path not
    found here is refused only where the job surely runs here (a machine without login
    hosts); elsewhere it may be on the login node the job is submitted through. A workload
    without a memory model, or whose model reads no checkpoint, leaves it to its trainer."""
    path = args.get("init_from")
    if not path or not workload.resources.memory_model:
        return
    where = os.path.join(workdir or os.getcwd(), path)  # an absolute path stays itself
    if not os.path.exists(where):
        if login_hosts:
            return
        raise MmmError(f"--init-from {path}: no such file or directory (looked in {where})")
    model, (_, model_args) = memory.model_of(workload, args)
    if model.checkpoint is None:
        return
    try:
        formats.check_model(formats.open_source(where, model), model_args)
    except PretrainedError as exc:
        raise MmmError(str(exc)) from None
