"""Model definitions, free of any parallelism (see trainers/parallelize.py)."""
