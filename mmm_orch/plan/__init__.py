"""Request -> Plan: every decision about one job, in named sections (plan/model.py), made by
plan/resolve.py from the machine profile, the workload spec and the user's options."""

from mmm_orch.plan.model import Plan, Request
from mmm_orch.plan.resolve import resolve

__all__ = ["Plan", "Request", "resolve"]
