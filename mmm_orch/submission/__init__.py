"""Handing a plan to a scheduler and recording it: one job (submit.py), the settling of a
submission that was cut off (settle.py), chains, sweeps, the points of a pack or of a sweep
inside an allocation (pack.py), the user's jobs counted against a queue's limits
(queue_load.py), where a job is submitted from and its Python checked there
(preflight.py), and jobs started inside an allocation (launch.py: `mmm-orch launch`)."""
