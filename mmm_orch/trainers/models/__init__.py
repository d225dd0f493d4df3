"""The small trainers' models (fsdp.py's CNN, vit.py's ViT), free of any parallelism; the
models the planner sizes, with their torch modules, are mmm_orch/models/."""
