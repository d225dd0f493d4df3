"""`rerun`: a recorded job submitted again where it ran before, or a pack's points that did not
complete as a new pack."""

from __future__ import annotations

import dataclasses
import posixpath

from mmm_orch.errors import MmmError
from mmm_orch.hosts import host_for
from mmm_orch.injob import ends
from mmm_orch.injob.protocol import CHECKPOINTS_DIR
from mmm_orch.planning.model import ChainLink, JobPlace
from mmm_orch.planning.store import stored_plan
from mmm_orch.records.db import db_path, open_db
from mmm_orch.records.record import JobRecord
from mmm_orch.schedulers import scheduler_kind
from mmm_orch.schedulers.states import JobState
from mmm_orch.submission import submit
from mmm_orch.submission.sweeps import pack_job
from mmm_orch.usecases.packs import rerun_pack, rerun_point
from mmm_orch.usecases.plans import avoiding, bad_nodes
from mmm_orch.usecases.submissions import check_room, ready, resuming, within_budgets


def rerun(old: JobRecord, resume: bool | None = None, db: str | None = None) -> JobRecord:
    """Submit `old`'s recorded plan again where it ran before (the same run directory), as a new
    job linked to it. `resume` True: from the run's latest checkpoint; False: from the start;
    None: as its end class calls for (injob/ends.py: from the latest checkpoint after a
    walltime, a crash, a lost node; from the start where it never reached a step; refused where
    its setup failed), and without the node its end points at. A pack job's rerun is a new pack
    of its points that did not complete (usecases/packs.py)."""
    opened = open_db(db)
    group = opened.groups.get(old.group_id) if opened is not None and old.group_id else None
    pack = (
        pack_job(opened, group)
        if opened is not None and group is not None and group["kind"] == "sweep"
        else None
    )
    if pack is not None:
        return (rerun_pack if pack.id == old.id else rerun_point)(old, bool(resume), db)[1]

    recorded = stored_plan(old.plan, f"job {old.id}'s recorded plan")
    if not scheduler_kind(old.scheduler).batch and scheduler_kind(recorded.scheduler).batch:
        raise MmmError(
            f"rerun: job {old.id} ran inside a {recorded.scheduler} allocation, on "
            "nodes it no longer has (`launch`, `sweep --within`): launch it again "
            "inside one, or submit it as a job of its own (`mmm-orch submit`)"
        )
    # A run that completed starts again (a node it left out is still left out).
    end = ends.BY_NAME.get(old.end_class)
    policy = ends.FRESH if old.state is JobState.COMPLETED else end.rerun if end else None
    if resume is None and end is not None and policy == ends.REFUSE:
        raise MmmError(
            f"rerun: job {old.id} ended {end.name} ({old.end_evidence[:160]}): its recorded "
            f"plan would stop there again; `mmm-orch machines check {old.machine}`, then submit "
            "anew (or `rerun --fresh` to try the same plan)"
        )
    if resume is None and end is ends.DISK_FULL and old.run_dir:
        _room_for_a_checkpoint(old)
    if resume:
        recorded = resuming(recorded)
    elif resume is None and policy == ends.RESUME:
        recorded = resuming(recorded, allow_fresh=True) if recorded.launch.can_resume else recorded
    if end is not None and end.avoid_node and old.end_node:
        recorded = avoiding(recorded, bad_nodes(db, recorded.machine))
    again = dataclasses.replace(
        recorded.with_launch(workdir_given=True), submission=JobPlace(), chain=ChainLink()
    )
    within_budgets(again, db, "this rerun")
    check_room(again, 1, old.remote, db)
    prepared = ready(again, None, old.remote, env_check=True)
    return submit.submit(
        prepared.plan, db_path(db), remote=prepared.remote, links={"rerun_of": old.id}
    )


# Below this much free room a run that filled its filesystem is not sent again, whatever its
# checkpoints take (a save writes its metadata and the trainers' state beside the shards).
MIN_ROOM_KIB = 1024


def _room_for_a_checkpoint(old: JobRecord) -> None:
    """Refuse the rerun of a run that filled its filesystem while that filesystem still has less
    room than its largest checkpoint took (complete, or cut short by the full disk): it would fill
    it again at its first save. (On Lustre one full OST is enough while `df` shows room: `lfs df`
    is the facility's word.)"""
    host = host_for(old.remote)
    checkpoints = posixpath.join(old.run_dir, CHECKPOINTS_DIR)
    free = host.run(["df", "-Pk", old.run_dir])
    sizes = host.run(
        ["sh", "-c", 'du -sk "$1"/step-* "$1"/.step-*.partial 2>/dev/null; true', "sh", checkpoints]
    )
    try:
        available = int(free.stdout.splitlines()[-1].split()[3])
    except (IndexError, ValueError):
        return  # no word from df (the directory gone): the job itself will say
    taken = [
        int(words[0])
        for words in map(str.split, sizes.stdout.splitlines())
        if words[:1] and words[0].isdigit()
    ]
    need = max([MIN_ROOM_KIB, *taken])
    if available < need:
        raise MmmError(
            f"rerun: job {old.id} ended disk-full ({old.end_evidence[:120]}), and {old.run_dir}'s "
            f"filesystem has {available / 1024:.1f} MiB free, less than the {need / 1024:.1f} MiB "
            "a checkpoint of it needs (its largest so far, at least 1 MiB): free room first "
            "(older checkpoints, other runs), or `rerun --resume` to try anyway"
        )
