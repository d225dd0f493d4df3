"""`rerun`: a recorded job submitted again where it ran before, or a pack's points that did not
complete as a new pack."""

from __future__ import annotations

import dataclasses

from mmm_orch.errors import MmmError
from mmm_orch.planning.model import ChainLink, JobPlace
from mmm_orch.planning.store import stored_plan
from mmm_orch.records.db import db_path, open_db
from mmm_orch.records.record import JobRecord
from mmm_orch.schedulers import scheduler_kind
from mmm_orch.submission import submit
from mmm_orch.submission.sweeps import pack_job
from mmm_orch.usecases.packs import rerun_pack, rerun_point
from mmm_orch.usecases.submissions import check_room, ready, resuming, within_budgets


def rerun(old: JobRecord, resume: bool, db: str | None = None) -> JobRecord:
    """Submit `old`'s recorded plan again where it ran before (the same run directory), as a new
    job linked to it; `resume`: from the run's latest checkpoint. A pack job's rerun is a new
    pack of its points that did not complete (usecases/packs.py)."""
    opened = open_db(db)
    group = opened.groups.get(old.group_id) if opened is not None and old.group_id else None
    pack = (
        pack_job(opened, group)
        if opened is not None and group is not None and group["kind"] == "sweep"
        else None
    )
    if pack is not None:
        return (rerun_pack if pack.id == old.id else rerun_point)(old, resume, db)[1]

    recorded = stored_plan(old.plan, f"job {old.id}'s recorded plan")
    if not scheduler_kind(old.scheduler).batch and scheduler_kind(recorded.scheduler).batch:
        raise MmmError(
            f"rerun: job {old.id} ran inside a {recorded.scheduler} allocation, on "
            "nodes it no longer has (`launch`, `sweep --within`): launch it again "
            "inside one, or submit it as a job of its own (`mmm-orch submit`)"
        )
    if resume:
        recorded = resuming(recorded)
    again = dataclasses.replace(
        recorded.with_launch(workdir_given=True), submission=JobPlace(), chain=ChainLink()
    )
    within_budgets(again, db, "this rerun")
    check_room(again, 1, old.remote, db)
    prepared = ready(again, None, old.remote, env_check=True)
    return submit.submit(
        prepared.plan, db_path(db), remote=prepared.remote, links={"rerun_of": old.id}
    )
