"""Request -> Plan: every decision about one job, in named sections (planning/model.py), made by
planning/resolve.py from the machine profile, the workload spec and the user's options."""

from mmm_orch.planning.model import Plan, Request
from mmm_orch.planning.resolve import resolve

__all__ = ["Plan", "Request", "resolve"]
