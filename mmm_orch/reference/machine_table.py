"""The machines, their queues, job limits and sources (docs/reference/machine-table.md), made
from the packaged profiles: what `mmm-orch show machine NAME` resolves, for every machine."""

from __future__ import annotations

import dataclasses
from typing import Any

from mmm_orch.reference import cell, header

INTRO = """
Each value in a profile (`mmm_orch/machines/NAME.yaml`) has its source in a comment beside it;
those marked `[?]` there are not confirmed by the facility's pages. Below, each machine's queues
in the order mmm-orch tries them when no `--queue` is given, the facility's job-count limits, and
the sources the profile names in its fields. `mmm-orch show machine NAME` shows the whole profile.
"""


def markdown() -> str:
    from mmm_orch.config import registry

    machines = [registry.load_machine(name) for name in registry.names("machines")]
    parts = [
        header("Machines: queues, limits and sources", "the packaged machine profiles", INTRO),
        "| machine | facility | scheduler | nodes | accelerators / node | launcher | backend |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in machines:
        devices = (
            f"{m.node.gpus} {m.node.gpu_model or m.node.device}".strip() if m.node.gpus else "CPU"
        )
        parts.append(
            f"| [{m.name}](#{m.name}) | {m.facility} | {m.scheduler.kind} | up to "
            f"{m.max_nodes} | {devices} ({m.node.device}) | {m.launcher.kind} | {m.backend} |"
        )
    parts.append("")
    parts += [_machine(m) for m in machines]
    return "\n".join(parts).rstrip() + "\n"


def _machine(m: Any) -> str:
    from mmm_orch.walltime import format_walltime

    lines = [f"## {m.name}", ""]
    if m.description:
        lines += [cell(m.description), ""]
    if m.queues:
        lines += [
            "| queue | nodes | walltime at most | chosen without --queue | job limits | notes |",
            "|---|---|---|---|---|---|",
        ]
        for q in m.queues:
            tiers = "; ".join(
                f"{t.name or 'tier'}: {t.min_nodes}-{t.max_nodes} nodes, "
                f"{format_walltime(t.max_walltime)}"
                for t in q.tiers
            )
            chosen = "by request only" if q.by_request else ("yes" if q.automatic else "no")
            limits = "; ".join(f"{limit.words()} ({limit.source})" for limit in q.job_limits)
            notes = "; ".join(n for n in (q.notes, tiers and f"tiers: {tiers}") if n)
            lines.append(
                f"| `{q.name}` | {q.min_nodes}-{q.max_nodes} | "
                f"{format_walltime(q.max_walltime)} | {chosen} | {cell(limits)} | "
                f"{cell(notes)} |"
            )
        lines.append("")
    if m.job_limits:
        lines += [
            "Across its queues: "
            + "; ".join(f"{limit.words()} ({cell(limit.source)})" for limit in m.job_limits)
            + ".",
            "",
        ]
    sources = sorted(set(_sources(m, "")))
    if sources:
        lines += ["Sources named in the profile's fields:", ""]
        lines += [f"- `{where}`: {cell(source)}" for where, source in sources]
        lines.append("")
    return "\n".join(lines)


def _sources(value: Any, where: str):
    """(field path, source) for every non-empty `source` field in the profile, depth first."""
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            inner = getattr(value, f.name)
            if f.name == "source" and inner:
                yield where or "(profile)", inner
            elif f.name != "job_limits":  # shown with their queue above
                yield from _sources(inner, f"{where}.{f.name}".lstrip("."))
    elif isinstance(value, list | tuple):
        for item in value:
            name = getattr(item, "name", "")
            yield from _sources(item, f"{where}[{name}]" if name else where)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _sources(item, f"{where}.{key}")
