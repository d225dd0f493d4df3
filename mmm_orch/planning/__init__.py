"""Request -> Plan: every decision about one job, in named sections (planning/model.py), put
together by planning/resolve.py from the machine profile, the workload spec and the user's
options, each section decided in its module (queue_choice.py, launch_layout.py, environment.py,
memory.py, cost.py)."""

from mmm_orch.planning.model import Plan, Request
from mmm_orch.planning.resolve import resolve

__all__ = ["Plan", "Request", "resolve"]
