"""A small project of your own, trained under mmm-orch with its runtime (see ../README.md)."""
