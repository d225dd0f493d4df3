"""Commands about the job database itself: db check, db backup, db recover."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("db", help="check, back up or recover the job database")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = actions.add_parser(
        "check", help="is the database whole, and does every job directory have its record?"
    )
    q.set_defaults(func=cmd_check)
    q = actions.add_parser("backup", help="copy the database to jobs.db.backup now")
    q.set_defaults(func=cmd_backup)
    q = actions.add_parser(
        "recover",
        help="rebuild the database from what can still be read of "
        "it, its backup and the job directories (the old file is kept)",
    )
    q.set_defaults(func=cmd_recover)


def cmd_check(args: argparse.Namespace) -> int:
    from mmm_orch.usecases import database

    lines = database.check(args.db)
    print("\n".join(lines))
    # A finding, not a bug in mmm-orch: exit 2, as for any database that cannot be used.
    if (error := database.needs_recovery(args.db, lines)) is not None:
        raise error
    return 0


def cmd_backup(args: argparse.Namespace) -> int:
    from mmm_orch.usecases import database

    print(f"backed up to {database.backup(args.db)}")
    return 0


def cmd_recover(args: argparse.Namespace) -> int:
    from mmm_orch.usecases import database

    path, moved, report = database.recover(args.db)
    sources = ", ".join(f"{n} from the {label}" for label, n in report.sources.items())
    print(f"recovered {len(report.rows)} jobs into {path} ({sources})")
    if moved:
        print(f"the old file is kept as {moved}")
    print("run `mmm-orch status --all` to refresh their states from the schedulers")
    return 0
