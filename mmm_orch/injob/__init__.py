"""What runs inside a job, in the job's own Python, beside the trainers: the watchdog that guards
the launch, failover to spare nodes, the chain's decisions between links, stopping process
groups, matching failure signatures, and the protocol (protocol.py) of every marker, exit code
and file name through which the job tells mmm-orch how it went.

Standard library only, and nothing from the rest of mmm-orch (no CLI, no job database, no
pydantic): a job must start and report even where the orchestrator's dependencies are missing.
"""
