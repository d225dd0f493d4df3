"""Job tables and details for the terminal (rich on a TTY, plain columns when piped) and JSON."""

from __future__ import annotations

import json
import time

from mmm_orch.jobs.record import JobRecord
from mmm_orch.jobs.track import Refresh

COLUMNS = ("id", "machine", "workload", "nodes", "state", "elapsed", "exit", "native id", "note")
_STYLE = {"completed": "green", "failed": "red", "timeout": "red", "hung": "red", "cancelled": "yellow",
          "not started": "yellow",
          "running": "cyan", "pending": "blue", "unknown": "magenta"}


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


def row(record: JobRecord, refresh: Refresh, now: float) -> dict[str, str]:
    if record.id in refresh.stale:
        note = f"stale {duration(refresh.stale[record.id])}"
    elif record.state.value == "pending":
        note = f"queued {duration(now - record.submitted_at)}"
        note += f" ({record.reason})" if record.reason else ""
    else:
        note = record.reason
    return {"id": str(record.id), "machine": record.machine, "workload": record.workload,
            "nodes": str(record.nodes), "state": record.state.value,
            "elapsed": duration(record.elapsed(now)), "exit": exit_text(record),
            "native id": record.native_id, "note": note[:60],
            "stale": record.id in refresh.stale}


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


def rows(records: list[JobRecord], refresh: Refresh, db=None, links: bool = False,
         sweeps: bool = True) -> list[dict[str, str]]:
    """One row per job; with `db`, the links of a chain as one row for the chain (`c<id>`, unless
    `links`) and the points of a sweep as one row for the sweep (`s<id>`, if `sweeps`)."""
    now = time.time()
    out: list[dict[str, str]] = []
    shown: set[int] = set()
    groups: dict[int, dict | None] = {}
    collapsed = {"chain": chain_row} if not links else {}
    if sweeps:
        collapsed["sweep"] = sweep_row
    for record in records:
        if db is not None and record.group_id is not None:
            if record.group_id not in groups:
                groups[record.group_id] = db.group(record.group_id)
            group = groups[record.group_id]
            if group and group["kind"] in collapsed:
                if record.group_id not in shown:
                    shown.add(record.group_id)
                    members = db.list(group_id=record.group_id)
                    out.append(collapsed[group["kind"]](group, members, refresh, now))
                continue
        out.append(row(record, refresh, now))
    return out


def sweep_row(group: dict, jobs: list[JobRecord], refresh: Refresh, now: float) -> dict[str, str]:
    from mmm_orch.jobs.sweeps import summary

    sweep = summary(group, jobs)
    spec = group["spec"]
    ids = sorted(job.id for job in jobs)
    return {"id": f"s{group['id']}", "machine": spec["machine"], "workload": spec["workload"],
            "nodes": ",".join(map(str, sweep["nodes"])), "state": sweep["state"].value,
            "elapsed": duration(sweep["elapsed"]), "exit": "-",
            "native id": f"jobs {ids[0]}-{ids[-1]}" if ids else "-",
            "note": sweep["note"][:60] + (f" (status --sweep {group['id']})"),
            "stale": any(job.id in refresh.stale for job in jobs)}


def chain_row(group: dict, links: list[JobRecord], refresh: Refresh, now: float) -> dict[str, str]:
    from mmm_orch.jobs.chains import summary

    chain = summary(group, links)
    current = chain["current"]
    return {"id": f"c{group['id']}", "machine": current.machine, "workload": current.workload,
            "nodes": str(current.nodes), "state": chain["state"].value,
            "elapsed": duration(chain["elapsed"]), "exit": exit_text(current),
            "native id": current.native_id, "note": chain["note"][:60],
            "stale": any(link.id in refresh.stale for link in links)}


def table(shown: list[dict[str, str]], tty: bool):
    """A rich Table on a TTY, else plain aligned text."""
    if not tty:
        widths = {c: max([len(c)] + [len(r[c]) for r in shown]) for c in COLUMNS}
        lines = ["  ".join(c.upper().ljust(widths[c]) for c in COLUMNS).rstrip()]
        lines += ["  ".join(r[c].ljust(widths[c]) for c in COLUMNS).rstrip() for r in shown]
        return "\n".join(lines) + "\n"
    from rich.table import Table

    tbl = Table(box=None, header_style="bold")
    for column in COLUMNS:
        tbl.add_column(column.upper(), justify="right" if column in ("id", "nodes") else "left")
    for r in shown:
        style = "dim" if r.get("stale") else _STYLE.get(r["state"], "")
        cells = [r[c] for c in COLUMNS]
        cells[COLUMNS.index("state")] = f"[{style}]{r['state']}[/]" if style else r["state"]
        tbl.add_row(*cells)
    return tbl


def details(record: JobRecord) -> str:
    """Everything about one job: identity, paths, state history, plan and script."""
    def when(t: float | None) -> str:
        return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))

    lines = [
        f"job {record.id}: {record.workload} on {record.machine} ({record.nodes} nodes, "
        f"{record.ranks} ranks), {record.scheduler} id {record.native_id} on {record.host}",
        f"state:       {record.state.value}" + (f" ({record.native_state})" if record.native_state else "")
        + (f", exit {exit_text(record)}" if record.terminal else "")
        + (f"; {record.reason}" if record.reason else ""),
        f"submitted:   {when(record.submitted_at)}   started: {when(record.started_at)}   "
        f"ended: {when(record.ended_at)}",
        f"submit dir:  {record.submit_dir}" + (f" (git {record.git_commit})" if record.git_commit else ""),
        f"job dir:     {record.job_dir}",
        f"script:      {record.script_path}",
        f"log:         {record.log_path}",
        *[f"{kind + ':':<13}{where}" for kind, where in _tracking(record).items()],
        "",
        "history:",
    ]
    for event in record.events:
        extra = " ".join(x for x in (event["native_state"], event["reason"]) if x)
        lines.append(f"  {when(event['at'])}  {event['state']:<10} {extra}".rstrip())
    lines += ["", "plan:", json.dumps(record.plan, indent=2), "", "script:", record.script]
    return "\n".join(lines)


def _tracking(record: JobRecord) -> dict[str, str]:
    """Where the run's trackers write, as its plan said (a recorded plan is read as data)."""
    where = record.plan.get("tracking") if isinstance(record.plan, dict) else None
    return {str(k): str(v) for k, v in where.items()} if isinstance(where, dict) else {}


def details_json(record: JobRecord) -> str:
    return json.dumps(record.to_dict(full=True), indent=2)
