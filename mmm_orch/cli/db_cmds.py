"""Commands about the job database itself: db check, db backup, db recover."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("db", help="check, back up or recover the job database")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = actions.add_parser("check", help="is the database whole, and does every job directory "
                           "have its record?")
    q.set_defaults(func=cmd_check)
    q = actions.add_parser("backup", help="copy the database to jobs.db.backup now")
    q.set_defaults(func=cmd_backup)
    q = actions.add_parser("recover", help="rebuild the database from what can still be read of "
                           "it, its backup and the job directories (the old file is kept)")
    q.set_defaults(func=cmd_recover)


def cmd_check(args: argparse.Namespace) -> int:
    from mmm_orch.jobs import recover
    from mmm_orch.jobs.db import db_path
    from mmm_orch.jobs.dbfile import DatabaseError

    path = db_path(args.db)
    lines = recover.check(path)
    print("\n".join(lines))
    if "NEEDS RECOVERY" in lines[0]:
        # A finding, not a bug in mmm-orch: exit 2, as for any database that cannot be used.
        raise DatabaseError(f"job database {path} needs recovery: run `mmm-orch db recover`")
    return 0


def cmd_backup(args: argparse.Namespace) -> int:
    from mmm_orch.cli.common import jobs_db
    from mmm_orch.errors import MmmError

    db = jobs_db(args)
    if db is None:
        raise MmmError("no job database yet: nothing to back up")
    print(f"backed up to {db.backup()}")
    return 0


def cmd_recover(args: argparse.Namespace) -> int:
    from mmm_orch.jobs import recover
    from mmm_orch.jobs.db import db_path

    path = db_path(args.db)
    moved, report = recover.recover(path)
    sources = ", ".join(f"{n} from the {label}" for label, n in report.sources.items())
    print(f"recovered {len(report.rows)} jobs into {path} ({sources})")
    if moved:
        print(f"the old file is kept as {moved}")
    print("run `mmm-orch status --all` to refresh their states from the schedulers")
    return 0
