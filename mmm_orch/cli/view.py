"""Job tables and details for the terminal (rich on a TTY, plain columns when piped) and JSON."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from mmm_orch.errors import one_line
from mmm_orch.usecases.following import Group, JobRecord, Refresh
from mmm_orch.usecases.step_profiles import PARTS, Profile

COLUMNS = ("id", "machine", "workload", "nodes", "state", "elapsed", "exit", "native id", "note")
# A line of `status`: each of COLUMNS's cells (str), and "stale" (bool) for its style.
Row = dict[str, Any]
_STYLE = {
    "completed": "green",
    "failed": "red",
    "timeout": "red",
    "hung": "red",
    "cancelled": "yellow",
    "not started": "yellow",
    "running": "cyan",
    "pending": "blue",
    "unknown": "magenta",
}


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def exit_text(record: JobRecord) -> str:
    if record.signal:
        return f"sig {record.signal}"
    return "-" if record.exit_code is None else str(record.exit_code)


def row(record: JobRecord, refresh: Refresh, now: float) -> Row:
    # The reason and the native id are the scheduler's words: shown escaped, as every name
    # from a scheduler is (a line break or a terminal escape in one would forge the table).
    if record.id in refresh.stale:
        note = f"stale {duration(refresh.stale[record.id])}"
    elif record.state.value == "pending":
        note = f"queued {duration(now - record.submitted_at)}"
        note += f" ({record.reason})" if record.reason else ""
    else:
        note = record.reason
    if record.end_class and record.end_class not in ("completed", record.state.value):
        note = f"{record.end_class} {record.end_node}".strip() + (f": {note}" if note else "")
    return {
        "id": str(record.id),
        "machine": record.machine,
        "workload": record.workload,
        "nodes": str(record.nodes),
        "state": record.state.value,
        "elapsed": duration(record.elapsed(now)),
        "exit": exit_text(record),
        "native id": one_line(record.native_id),
        "note": one_line(note)[:60],
        "stale": record.id in refresh.stale,
    }


def json_rows(records: list[JobRecord], refresh: Refresh) -> str:
    now = time.time()
    out = []
    for record in records:
        data = record.to_dict()
        data["stale"] = record.id in refresh.stale
        data["stale_age_s"] = refresh.stale.get(record.id)
        data["elapsed_s"] = record.elapsed(now)
        out.append(data)
    return json.dumps(out, indent=2)


def rows(lines: list[JobRecord | Group], refresh: Refresh) -> list[Row]:
    """One row per job, chain (`c<id>`) or sweep (`s<id>`) of `status`."""
    now = time.time()
    shown = {"chain": chain_row, "sweep": sweep_row}
    return [
        shown[line.kind](line, refresh, now) if isinstance(line, Group) else row(line, refresh, now)
        for line in lines
    ]


def sweep_row(group: Group, refresh: Refresh, now: float) -> Row:
    sweep, spec = group.summary, group.spec
    ids = sorted(job.id for job in group.members)
    return {
        "id": f"s{group.id}",
        "machine": spec["machine"],
        "workload": spec["workload"],
        "nodes": ",".join(map(str, sweep["nodes"])),
        "state": sweep["state"].value,
        "elapsed": duration(sweep["elapsed"]),
        "exit": "-",
        "native id": f"jobs {ids[0]}-{ids[-1]}" if ids else "-",
        "note": one_line(sweep["note"])[:60] + (f" (status --sweep {group.id})"),
        "stale": any(job.id in refresh.stale for job in group.members),
    }


def chain_row(group: Group, refresh: Refresh, now: float) -> Row:
    chain = group.summary
    current = chain["current"]
    return {
        "id": f"c{group.id}",
        "machine": current.machine,
        "workload": current.workload,
        "nodes": str(current.nodes),
        "state": chain["state"].value,
        "elapsed": duration(chain["elapsed"]),
        "exit": exit_text(current),
        "native id": one_line(current.native_id),
        "note": one_line(chain["note"])[:60],
        "stale": any(link.id in refresh.stale for link in group.members),
    }


@contextlib.contextmanager
def live(on: bool) -> Iterator[Callable[[Any], None]]:
    """Where each table goes: redrawn in place (`on`: --watch on a terminal), printed with rich
    on a terminal, else written as plain text."""
    if on:
        from rich.live import Live  # rich costs start-up; only status and the tables need it

        shown = Live(auto_refresh=False)
        shown.start()
        try:
            yield lambda table: shown.update(table, refresh=True)
        finally:
            shown.stop()
    elif sys.stdout.isatty():
        from rich.console import Console

        yield Console().print
    else:
        yield write


def write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def table(shown: list[Row], tty: bool):
    """A rich Table on a TTY, else plain aligned text."""
    if not tty:
        widths = {c: max([len(c)] + [len(r[c]) for r in shown]) for c in COLUMNS}
        lines = ["  ".join(c.upper().ljust(widths[c]) for c in COLUMNS).rstrip()]
        lines += ["  ".join(r[c].ljust(widths[c]) for c in COLUMNS).rstrip() for r in shown]
        return "\n".join(lines) + "\n"
    from rich.markup import escape
    from rich.table import Table

    tbl = Table(box=None, header_style="bold")
    for column in COLUMNS:
        tbl.add_column(column.upper(), justify="right" if column in ("id", "nodes") else "left")
    for r in shown:
        style = "dim" if r.get("stale") else _STYLE.get(r["state"], "")
        # A cell is text, never rich markup: a reason with "[/]" in it would raise, "[red]" restyle.
        cells = [escape(r[c]) for c in COLUMNS]
        cells[COLUMNS.index("state")] = f"[{style}]{r['state']}[/]" if style else r["state"]
        tbl.add_row(*cells)
    return tbl


def details(record: JobRecord) -> str:
    """Everything about one job: identity, paths, state history, plan and script."""

    def when(t: float | None) -> str:
        return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))

    header = [
        f"job {record.id}: {record.workload} on {record.machine} ({record.nodes} nodes, "
        f"{record.ranks} ranks), {record.scheduler} id {record.native_id} on {record.host}",
        f"state:       {record.state.value}"
        + (f" ({record.native_state})" if record.native_state else "")
        + (f", exit {exit_text(record)}" if record.terminal else "")
        + (f"; {record.reason}" if record.reason else ""),
        *(
            [
                f"ended as:    {record.end_class} {record.end_node}".rstrip()
                + (f" ({record.end_evidence})" if record.end_evidence else "")
            ]
            if record.end_class
            else []
        ),
        f"submitted:   {when(record.submitted_at)}   started: {when(record.started_at)}   "
        f"ended: {when(record.ended_at)}",
        f"submit dir:  {record.submit_dir}"
        + (f" (git {record.git_commit})" if record.git_commit else ""),
        f"job dir:     {record.job_dir}",
        f"script:      {record.script_path}",
        f"log:         {record.log_path}",
        *[f"{kind + ':':<13}{where}" for kind, where in _tracking(record).items()],
    ]
    # One line each, whatever the scheduler's state and reason say (escaped, as names are).
    lines = [*map(one_line, header), "", "history:"]
    for event in record.events:
        extra = " ".join(x for x in (event["native_state"], event["reason"]) if x)
        lines.append(one_line(f"  {when(event['at'])}  {event['state']:<10} {extra}".rstrip()))
    lines += ["", "plan:", json.dumps(record.plan, indent=2), "", "script:", record.script]
    return "\n".join(lines)


def _tracking(record: JobRecord) -> dict[str, str]:
    """Where the run's trackers write, as its plan said (a recorded plan is read as data)."""
    where = record.plan.get("tracking") if isinstance(record.plan, dict) else None
    return {str(k): str(v) for k, v in where.items()} if isinstance(where, dict) else {}


def details_json(record: JobRecord) -> str:
    return json.dumps(record.to_dict(full=True), indent=2)


_PART_NAMES = {"exposed_comm": "exposed comm"}


def profile_text(found: Profile) -> str:
    """Per profiled rank, its window's steps split into PARTS (ms and share), then its top
    operators and collectives; the slowest rank last."""
    lines = [f"traces: {found.where}"]
    for rank in found.ranks:
        # A pipeline's bubble where the rank had one (no transfers between stages: none)
        parts = [p for p in PARTS if p != "bubble" or any(s.parts_ms[p] for s in rank.steps)]
        header = ["step", "ms", *(_PART_NAMES.get(p, p) for p in parts), "comm (hidden)"]
        lines += ["", f"rank {rank.rank} ({one_line(rank.host)}), step time by part (ms, share):"]
        table = [header]
        for step in rank.steps:
            table.append(
                [
                    str(step.step),
                    f"{step.total_ms:.1f}",
                    *(f"{step.parts_ms[p]:.1f} {100 * step.share(p):.0f}%" for p in parts),
                    f"{step.comm_ms:.1f} ({step.hidden_comm_ms:.1f})",
                ]
            )
        table.append(
            [
                "mean",
                f"{rank.mean_step_ms:.1f}",
                *(f"{100 * rank.mean_share(p):.0f}%" for p in parts),
                "",
            ]
        )
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        lines += [
            "  " + "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in table
        ]
        for title, items in (
            ("operators (ms in the window, inclusive)", rank.top_ops),
            ("collectives (ms in the window, inclusive)", rank.top_collectives),
            ("kernels (ms on the device in the window)", rank.top_kernels),
        ):
            if items:
                lines.append(f"  top {title}:")
                lines += [f"    {ms:10.1f}  {one_line(name)}" for name, ms in items]
    if found.slowest is not None:
        slowest, lag = found.slowest
        lines += [
            "",
            f"slowest: rank {slowest.rank} ({one_line(slowest.host)}), mean step "
            f"{slowest.mean_step_ms:.1f} ms, {100 * lag:.1f}% over the fastest",
        ]
    return "\n".join(lines)


def profile_dicts(found: Profile) -> dict[str, Any]:
    return {
        "traces": str(found.where),
        "ranks": [
            {
                "rank": rank.rank,
                "host": rank.host,
                "mean_step_ms": rank.mean_step_ms,
                "shares": {p: rank.mean_share(p) for p in PARTS},
                "steps": [
                    {
                        "step": s.step,
                        "ms": s.total_ms,
                        "parts_ms": s.parts_ms,
                        "comm_ms": s.comm_ms,
                        "hidden_comm_ms": s.hidden_comm_ms,
                    }
                    for s in rank.steps
                ],
                "top_ops": rank.top_ops,
                "top_collectives": rank.top_collectives,
                "top_kernels": rank.top_kernels,
            }
            for rank in found.ranks
        ],
        "slowest": None
        if found.slowest is None
        else {"rank": found.slowest[0].rank, "lag": found.slowest[1]},
    }
