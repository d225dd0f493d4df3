"""Why did a job die: the first real failure in its log, matched against known signatures (the
machine profile's own, then machines/common/failures.yaml), with the node it happened on.

The first real failure is the earliest line matching a specific signature; else the earliest
catch-all (any Python exception); else the earliest consequence (a peer gone, a collective timed
out: what survivors report when another rank died first). Fallout lines (ranks killed because
another rank failed) never count.

Runs inside jobs too (failover), in the job's Python: the standard library only. A signature is
a config.machine.FailureSignature or a plain object with its fields (failures.json).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mmm_orch.injob import protocol

# Who a line is about: `x4512c5s2b0n0: rank 6 ...` (PALS), `n1: task 3: ...` (srun), `[rank0]:`.
_HOST_PREFIX = re.compile(r"^(?P<host>[A-Za-z][\w.-]*\d[\w.-]*): ")
_RANK_PREFIX = re.compile(r"^\[rank(?P<rank>\d+)\]:")
# MPICH Hydra names the host on the line before the exit code of a rank it lost.
_RUNNING_AT = re.compile(r"RUNNING AT (?P<host>\S+)")
# Failure signatures read this much of a line: what identifies a failure comes first, and a
# 100 kB line (a dumped tensor) must not cost a backtracking search its whole length.
MAX_LINE = 4096
# After these, what a launcher reports is its own teardown of the other ranks, not a cause.
TEARDOWN = re.compile(
    r"srun: (launch/slurm: _step_signal: )?Terminating StepId|"
    r"YOU CAN IGNORE THE BELOW CLEANUP MESSAGES"
)


@dataclass
class Finding:
    signature: Any
    line_number: int
    line: str
    host: str = ""
    rank: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "signature": self.signature.name,
            "line_number": self.line_number,
            "line": self.line,
            "host": self.host,
            "rank": self.rank,
            "meaning": self.signature.meaning,
            "fix": self.signature.fix,
            "source": self.signature.source,
        }


@dataclass
class Diagnosis:
    first: Finding | None
    later: dict[str, int]  # other specific signatures seen after the first: name -> lines
    fallout: int  # lines ignored as consequences of the first failure

    def to_dict(self) -> dict[str, Any]:
        return {
            "first": self.first.to_dict() if self.first else None,
            "later": self.later,
            "fallout_lines": self.fallout,
        }


def diagnose(text: str, signatures: list[Any]) -> Diagnosis:
    compiled = [(s, re.compile(s.pattern)) for s in signatures]
    findings: list[Finding] = []  # every non-fallout match, one per line, in log order
    fallout = 0
    job_host = ""
    prefix_hosts: set[str] = set()
    running_at = ""
    torn_down = False
    for number, line in enumerate(text.splitlines(), start=1):
        torn_down = torn_down or bool(TEARDOWN.search(line))
        if not job_host and (match := protocol.JOB_HOST.search(line)):
            job_host = match["host"]
        if match := _RUNNING_AT.search(line):
            running_at = match["host"]
        if prefix := _HOST_PREFIX.match(line):
            prefix_hosts.add(prefix["host"])
        for signature, pattern in compiled:
            if match := pattern.search(line[:MAX_LINE]):
                if signature.fallout or (signature.node_fault and torn_down):
                    fallout += 1
                else:
                    finding = _finding(signature, match, number, line)
                    finding.host = finding.host or (running_at if signature.node_fault else "")
                    findings.append(finding)
                break  # one signature per line: the most specific, listed first

    def rank(finding: Finding) -> int:  # causes first, then any exception, then consequences
        return 2 if finding.signature.consequence else 1 if finding.signature.catch_all else 0

    chosen = min(findings, key=lambda f: (rank(f), f.line_number), default=None)
    later: dict[str, int] = {}
    for finding in findings:
        if chosen and finding.line_number > chosen.line_number and not finding.signature.catch_all:
            later[finding.signature.name] = later.get(finding.signature.name, 0) + 1
    if chosen and not chosen.host:
        # A line without a node name: the only node the launcher named, else the head node.
        chosen.host = prefix_hosts.pop() if len(prefix_hosts) == 1 else job_host
    return Diagnosis(first=chosen, later=later, fallout=fallout)


def _finding(signature: Any, match: re.Match, number: int, line: str) -> Finding:
    host = match.groupdict().get("host") or ""
    if not host and (prefix := _HOST_PREFIX.match(line)):
        host = prefix["host"]
    rank = _RANK_PREFIX.match(line)
    return Finding(
        signature=signature,
        line_number=number,
        line=line.strip()[:400],
        host=host,
        rank=int(rank["rank"]) if rank else None,
    )


# What a module system says about a load it refused (Lmod, which wraps its words at 80 columns;
# Environment Modules 4+ and 3.2).
_UNKNOWN = re.compile(r'module\(s\) are unknown:\s*((?:"[^"]+"\s*)+)')
_UNLOCATED = re.compile(r"Unable to locate a modulefile for '([^']+)'")
_CONFLICT = re.compile(
    r'Cannot load module "([^"]+)" because these\s+module\(s\)\s+are\s+loaded:\s*(\S+)'
    r"|Module cannot be loaded due to a conflict"
)


def setup_failure(text: str, machine: str) -> str:
    """The job's setup line that failed (the script's SETUP_FAILED line), in words, with the
    command that finds what moved; '' when no setup line failed."""
    lines = text.splitlines()
    at = next(
        (i for i in range(len(lines) - 1, -1, -1) if protocol.SETUP_FAILURE.search(lines[i])), None
    )
    if at is None:
        return ""
    failed = protocol.SETUP_FAILURE.search(lines[at])
    assert failed is not None
    code, line = failed.group(1), failed.group(2).strip()
    said = "\n".join(lines[max(0, at - 30) : at])
    check = f"`mmm-orch machines check {machine}`"
    if unknown := _UNKNOWN.search(said):
        names = re.findall(r'"([^"]+)"', unknown.group(1))
        asked = [n for n in names if n in line.split()]
        if asked:
            return f"module {', '.join(asked)} not found: the stack has moved; {check}"
        return (
            f"`{line}` needs module {', '.join(names)}, which is not found: the stack has "
            f"moved; {check}"
        )
    if located := _UNLOCATED.search(said):
        return f"module {located.group(1)} not found: the stack has moved; {check}"
    if conflict := _CONFLICT.search(said):
        what = (
            f"module {conflict.group(1)} conflicts with the loaded {conflict.group(2)}"
            if conflict.group(1)
            else "a module conflicts with one already loaded"
        )
        return f"`{line}`: {what}; {check}"
    last = next((s.strip() for s in reversed(said.splitlines()) if s.strip()), "")
    said_last = f": {last[:200]}" if last else ""
    return f"setup line `{line}` failed (exit {code}){said_last}; {check}"
