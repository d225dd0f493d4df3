"""Pretrained weights: Hugging Face and Meta checkpoints in (formats, read), Hugging Face
safetensors out (export)."""
