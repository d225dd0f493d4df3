"""In-repo trainers, each started as `python -m mmm_orch.trainers.<name>` by the job script."""
