"""Terminal output: tables, JSON, and highlighted scripts (rich is imported only here)."""

from __future__ import annotations

import json
import sys
from typing import Any

from mmm_orch.config import registry
from mmm_orch.walltime import format_walltime


def machine_rows() -> list[dict[str, Any]]:
    rows = []
    for name in registry.names("machines"):
        m = registry.load_machine(name)
        rows.append({
            "name": m.name,
            "facility": m.facility,
            "scheduler": m.scheduler.kind,
            "max_nodes": m.max_nodes,
            "gpus_per_node": m.node.gpus,
            "device": m.node.device,
            "queues": [q.name for q in m.queues],
        })
    return rows


def workload_rows() -> list[dict[str, Any]]:
    rows = []
    for name in registry.names("workloads"):
        w = registry.load_workload(name)
        layout = ", ".join(f"{k}={w.layout_value(k, w.args)}" for k in ("tp", "pp") if k in w.options)
        rows.append({
            "name": w.name,
            "trainer": w.trainer.rsplit(".", 1)[-1] if w.trainer else "(your command after --)",
            "parallelism": (f"FSDP2{' x TP' if 'tp' in w.options else ''}" + (f" ({layout})" if layout else "")
                            if w.trainer else "yours"),
            "default_nodes": w.defaults.nodes,
            "default_walltime": format_walltime(w.defaults.walltime),
            "description": w.description,
        })
    return rows


def _console():
    from rich.console import Console

    return Console()


def print_rows(rows: list[dict[str, Any]], as_json: bool, title: str) -> None:
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    columns = [c for c in rows[0] if c not in ("queues", "description")] if rows else []
    for column in columns:
        table.add_column(column.replace("_", " "))
    for row in rows:
        table.add_row(*(str(row[c]) for c in columns))
    _console().print(table)


def print_model(obj: Any, as_json: bool) -> None:
    from mmm_orch.config.yamlio import adapter

    data = adapter(type(obj)).dump_python(obj, mode="json", exclude_defaults=not as_json)
    if as_json:
        print(json.dumps(data, indent=2))
        return
    import yaml

    text = yaml.safe_dump(data, sort_keys=False, width=100)
    if sys.stdout.isatty():
        from rich.syntax import Syntax

        _console().print(Syntax(text, "yaml", background_color="default"))
    else:
        sys.stdout.write(text)


def print_script(script: str) -> None:
    from rich.syntax import Syntax

    _console().print(Syntax(script, "bash", background_color="default", word_wrap=False))
