"""Exit codes and error kinds (docs/reference/exit-codes.md), from their definitions: the errors
the commands and the Python API raise (mmm_orch/errors.py) and the codes a job's script, its
watchdog and its trainers end with (injob/protocol.py), which status, diagnose and rerun read."""

from __future__ import annotations

import inspect
import re

from mmm_orch import errors
from mmm_orch.injob import ends, protocol
from mmm_orch.reference import cell, header

INTRO = """
A command's own exit codes (0 done, 1 a bug, 2 refused, 3 unreachable, 130 interrupted) are
explained with [the commands](commands.md#exit-codes).
"""


def markdown() -> str:
    parts = [
        header("Exit codes and errors", "mmm_orch/errors.py and mmm_orch/injob/protocol.py", INTRO),
        "## Errors",
        "",
        cell(errors.__doc__),
        "",
        "Every error is an `mmm_orch.MmmError`; its `str` is the one line the command prints "
        "after `mmm-orch: error:`.",
        "",
        "| error | is a | exit code | when |",
        "|---|---|---|---|",
    ]
    kinds = [
        c for c in vars(errors).values() if inspect.isclass(c) and issubclass(c, errors.MmmError)
    ]
    for kind in kinds:
        parent = kind.__mro__[1].__name__ if kind is not errors.MmmError else "Exception"
        parts.append(
            f"| `{kind.__name__}` | `{parent}` | {kind.exit_code} | {cell(kind.__doc__)} |"
        )
    parts += [
        "",
        "## A job's exit codes",
        "",
        "Beside the program's own code, a job ends with these, which `status`, `diagnose` "
        "and a chain's next link read:",
        "",
        "| code | name | meaning |",
        "|---|---|---|",
    ]
    source = inspect.getsource(protocol)
    for name, code, said in re.findall(r"^(EXIT_\w+) = (\d+)\s+#\s*(.*)$", source, re.M):
        assert getattr(protocol, name) == int(code), name  # the line read is the value used
        parts.append(f"| {code} | `{name}` | {cell(said)} |")
    parts += [
        "",
        "## How a job ended: the end classes",
        "",
        "Once a job ended, `mmm-orch status` names its end class (and the node it points at) "
        "in its note, `status --json` and the record hold it (`end_class`, `end_node`, "
        "`end_evidence`), and `mmm-orch diagnose` says it with what a rerun would do. "
        "`mmm-orch rerun JOB`, without `--resume` or `--fresh`, does what the class calls for: "
        f"**{ends.RESUME}** from the run's latest checkpoint (from the start where none was "
        f"saved, or the workload cannot resume), **{ends.FRESH}** from the start, or "
        f"**{ends.REFUSE}** (one line saying what to change). A failure signature "
        "(`failures:` of a profile, machines/common/failures.yaml) may point at one with "
        f"`end:` ({', '.join(f'`{n}`' for n in ends.LOG_CLASSES)}).",
        "",
        "| class | what happened | what mmm-orch reads | what it does and records | rerun |",
        "|---|---|---|---|---|",
    ]
    for end in ends.CLASSES:
        rerun = end.rerun + (", without the node" if end.avoid_node else "")
        parts.append(
            f"| `{end.name}` | {cell(end.what)} | {cell(end.read)} | {cell(end.does)} | {rerun} |"
        )
    return "\n".join(parts).rstrip() + "\n"
