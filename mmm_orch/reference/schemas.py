"""The machine and workload schemas (docs/reference/schemas.md), made from the JSON Schema that
`mmm-orch schema` prints and the profiles are checked against: each part a table of its fields,
their types, defaults and descriptions."""

from __future__ import annotations

import json
from typing import Any

from mmm_orch.reference import cell, header

INTRO = """
A profile (`machines/*.yaml`, or your own in `./.mmm-orch/machines/`) and a spec
(`workloads/*.yaml`) are checked against these before anything else: an unknown key or a value of
the wrong type is refused with the file, the field and what is allowed. `mmm-orch schema machine`
(or `workload`) prints the JSON Schema itself, for an editor's completion; [adding a
machine](../development/adding-a-machine.md) shows a profile of your own.
"""


def markdown() -> str:
    from mmm_orch.usecases.machines import schema

    parts = [header("Machine and workload schemas", "the JSON Schema of `mmm-orch schema`", INTRO)]
    for kind in ("machine", "workload"):
        made = schema(kind)
        parts += [f"## The {kind} {'profile' if kind == 'machine' else 'spec'}", ""]
        parts.append(_part(made, made["title"], kind, level="###"))
        for name, part in sorted(made.get("$defs", {}).items()):
            parts.append(_part(part, name, kind, level="####"))
    return "\n".join(parts).rstrip() + "\n"


def _anchor(kind: str, name: str) -> str:
    return f"{kind}-{name}".lower()


def _part(part: dict[str, Any], name: str, kind: str, level: str) -> str:
    lines = [f"{level} `{name}` {{ #{_anchor(kind, name)} }}", ""]
    if part.get("description"):
        lines += [cell(part["description"]), ""]
    properties = part.get("properties", {})
    if properties:
        required = set(part.get("required", []))
        lines += ["| field | type | default | meaning |", "|---|---|---|---|"]
        for field, spec in properties.items():
            default = "required" if field in required else _value(spec.get("default"))
            lines.append(
                f"| `{field}` | {_type(spec, kind)} | {default} | "
                f"{cell(spec.get('description', ''))} |"
            )
        lines.append("")
    return "\n".join(lines)


def _type(spec: dict[str, Any], kind: str) -> str:
    if "$ref" in spec:
        name = spec["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{_anchor(kind, name)})"
    if "enum" in spec:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in spec["enum"])
    if "const" in spec:
        return f"`{json.dumps(spec['const'])}`"
    for key in ("anyOf", "oneOf"):
        if key in spec:
            return " or ".join(_type(choice, kind) for choice in spec[key])
    kind_of = spec.get("type", "any")
    if kind_of == "array":
        return f"list of {_type(spec.get('items', {}), kind)}"
    if kind_of == "object" and isinstance(spec.get("additionalProperties"), dict):
        return f"map to {_type(spec['additionalProperties'], kind)}"
    text = kind_of if isinstance(kind_of, str) else " or ".join(kind_of)
    if "pattern" in spec:
        text += f" matching `{spec['pattern']}`".replace("|", "\\|")
    return text


def _value(value: Any) -> str:
    if value is None or value in ("", [], {}):
        return "" if value is None else f"`{json.dumps(value)}`"
    return cell(f"`{json.dumps(value)}`")
