"""Peak dense bf16 FLOPS per device (as the launcher counts devices) for MFU."""

from __future__ import annotations

# name fragment (lower case) -> (peak bf16 dense FLOPS, source); the first fragment found wins,
# so variants come before their family.
PEAK_BF16 = {
    "h200": (989e12, "NVIDIA H200 datasheet: 989 TFLOPS BF16 Tensor Core, dense (SXM)"),
    "h100 pcie": (756e12, "NVIDIA H100 datasheet: 756 TFLOPS BF16 Tensor Core, dense (PCIe)"),
    "h100 nvl": (835e12, "NVIDIA H100 NVL datasheet: 835 TFLOPS BF16 Tensor Core, dense, per GPU"),
    "h100": (989e12, "NVIDIA H100 datasheet: 989 TFLOPS BF16 Tensor Core, dense (SXM5)"),
    "a100": (312e12, "NVIDIA A100 datasheet: 312 TFLOPS BF16 Tensor Core, dense"),
    # One MI250X is two GCDs, and Slurm profiles count GCDs as devices.
    "mi250x": (191.5e12, "AMD Instinct MI250X spec: 383 TFLOPS BF16 per OAM, 2 GCDs"),
    # One Max 1550 is two tiles, and PVC profiles count tiles as devices.
    "max 1550": (
        419.5e12,
        "Intel Data Center GPU Max 1550: 839 TFLOPS BF16 (XMX) per GPU, 2 tiles",
    ),
}


def peak_flops(device_name: str) -> float | None:
    name = device_name.lower()
    for fragment, (flops, _) in PEAK_BF16.items():
        if fragment in name:
            return flops
    return None


def transformer_flops_per_token(
    params: int, embedding_params: int, n_layers: int, n_heads: int, head_dim: int, seq_len: int
) -> float:
    """Training FLOPs per token: 6 per non-embedding parameter plus attention scores,
    12 * layers * heads * head_dim * seq_len (the PaLM appendix B count, as torchtitan uses)."""
    return 6 * (params - embedding_params) + 12 * n_layers * n_heads * head_dim * seq_len


class TokenRate:
    """A step's tokens per second per device, and its MFU where the device's peak is known."""

    def __init__(self, flops_per_token: float, device_name: str, world_size: int):
        self.flops_per_token, self.world_size = flops_per_token, world_size
        self.peak = peak_flops(device_name)

    def __call__(self, tokens: int, seconds: float) -> dict[str, float | None]:
        per_device = tokens / seconds / self.world_size
        return {
            "tokens_per_s": per_device,
            "mfu": 100 * self.flops_per_token * per_device / self.peak if self.peak else None,
        }
