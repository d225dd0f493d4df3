"""mmm-orch: turn a machine profile and a workload spec into a correct, reviewable, tracked job."""

__version__ = "0.1.0"
