"""A pack where it cannot run is refused in one line before anything is written: on a machine
whose scheduler grants no allocation (the local executor), in a review and at submission, and
the `rerun` of such a pack recorded by an earlier version; through --host, in a review as at
submission. In-process: nothing here reaches a scheduler."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from helpers.jobs import assert_nothing_recorded

LOCAL_PACK = (
    "--pack: machine local runs its jobs on this computer without a batch scheduler, so a pack "
    "job has no allocation for its points to share; run the sweep without --pack"
)


def _counts() -> dict[str, int]:
    """Rows of the job database's tables (none where it was never made)."""
    path = Path(os.environ["XDG_STATE_HOME"]) / "mmm-orch" / "jobs.db"
    if not path.exists():
        return {}
    with sqlite3.connect(path) as conn:
        return {
            table: conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
            for table in ("jobs", "events", "groups", "group_plans")
        }


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mmm-orch: error: "), err
    return lines[0]


def test_a_pack_on_a_machine_without_a_scheduler_is_refused_before_anything_is_written(cli):
    for review in ([], ["--dry-run"]):
        result = cli("sweep", "local", "fsdp", "--set", "epochs=1,2", "--pack", *review)
        assert result.code == 2, result
        assert LOCAL_PACK in _one_error_line(result.err)
        assert result.out == ""
    assert_nothing_recorded()
    assert not any(_counts().values())


def test_the_rerun_of_a_pack_recorded_on_such_a_machine_is_refused(cli):
    """A database as an earlier version left it: a local pack whose job ended at once and whose
    points are `not started`. Neither the pack's rerun (resumed or not) nor a point's submits
    another."""
    from mmm_orch.planning import Request, resolve
    from mmm_orch.records.db import db_path, open_db
    from mmm_orch.records.record import PACK_INDEX
    from mmm_orch.submission import submit, sweeps

    db = open_db(str(db_path(None)), create=True)
    swept = {"epochs": ["1", "2"]}
    points = sweeps.points(Request("local", "fsdp"), swept, new_jobs=False)
    sweep = sweeps.new_sweep(db, swept, points, pack={"template": None})
    pack_job = resolve(Request("local", "command", command=("true",)))
    pack = submit.record_not_started(
        pack_job,
        db_path(None),
        {"group_id": sweep, "group_index": PACK_INDEX},
        "not inside an allocation on local",
    )
    point = submit.record_not_started(
        points[0].plan, db_path(None), {"group_id": sweep, "group_index": 1}, "pack job failed"
    )
    before = _counts()
    assert before["jobs"] == 2 and before["groups"] == 1

    for job, what in ((pack, "is a pack"), (point, "is a point of a pack")):
        for resume in ([], ["--resume"]):
            result = cli("rerun", str(job), *resume)
            assert result.code == 2, result
            line = _one_error_line(result.err)
            assert f"rerun: job {job} {what}: machine local runs its jobs on this computer" in line
            assert "run the sweep without --pack" in line
    assert _counts() == before


def test_a_pack_through_a_login_host_is_refused_in_a_review_as_at_submission(cli):
    said = []
    for review in (["--dry-run"], []):
        result = cli(
            "sweep",
            "slurm-local",
            "--nodes",
            "1,2",
            "--pack",
            "--host",
            "login.example",
            *review,
            "--",
            "true",
        )
        assert result.code == 2, result
        said.append(_one_error_line(result.err))
    assert said[0] == said[1]
    assert "--pack submits from slurm-local's login node, not through --host" in said[0]
    assert "(login.example)" in said[0]
    assert_nothing_recorded()
    assert not any(_counts().values())
