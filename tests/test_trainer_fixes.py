"""The trainer bugs of the "train for real" issue, each shown by a run or a call that failed before
its fix: oneCCL's backend never registered, XPU random state not saved, rank 0's loss logged
for the mean, and every rank drawing the same dropout masks."""

from __future__ import annotations

import importlib
import sys

import pytest

from helpers.training import launch, steps

BINDINGS = "oneccl_bindings_for_pytorch"


def test_backend_ccl_imports_oneccls_bindings_which_register_it(tmp_path, monkeypatch):
    """Here, each choice made with the bindings not yet imported (as in a fresh process), and
    forgotten after it."""
    from mmm_orch.runtime.device import DeviceError, select

    def chosen(backend: str) -> tuple[str, bool]:
        sys.modules.pop(BINDINGS, None)
        importlib.invalidate_caches()
        try:
            device = select(0, {"MMM_DEVICE": "cpu", "MMM_BACKEND": backend})
            return device.backend, BINDINGS in sys.modules
        finally:
            sys.modules.pop(BINDINGS, None)

    # A stand-in for the package (it is not on PyPI): importing it is what registers 'ccl'.
    (tmp_path / f"{BINDINGS}.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert chosen("ccl") == ("ccl", True)
    assert chosen("gloo") == ("gloo", False)
    (tmp_path / f"{BINDINGS}.py").unlink()
    with pytest.raises(DeviceError, match=f"backend ccl needs {BINDINGS}"):
        chosen("ccl")


def test_an_xpus_random_state_is_saved_and_restored(monkeypatch):
    import torch

    from mmm_orch.runtime import checkpoint

    # This machine has no XPU: torch.xpu answers as on one that has, with a generator's state.
    restored = []
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    monkeypatch.setattr(torch.xpu, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.xpu, "get_rng_state", lambda: torch.tensor([7], dtype=torch.uint8))
    monkeypatch.setattr(torch.xpu, "set_rng_state", restored.append)
    state = checkpoint._rng_state()
    assert state["xpu"].tolist() == [7] and "cpu" in state
    checkpoint._set_rng_state(state)
    assert [s.tolist() for s in restored] == [[7]]


@pytest.mark.slow
def test_fsdp_logs_the_mean_loss_of_ranks_that_draw_their_own_dropout_masks(tmp_path):
    """Step 1 on 2 ranks, against each rank's step 1 recomputed here: rank r's batch through the
    shared initial weights, with rank r's own dropout stream. The logged loss is their mean."""
    import torch

    from mmm_orch.runtime.data import SyntheticImages, batch_indices
    from mmm_orch.runtime.loop import draw_per_rank
    from mmm_orch.trainers.fsdp import _Slice
    from mmm_orch.trainers.models.cnn import MnistCNN

    seed, batch, samples = 3, 8, 64
    proc = launch("fsdp", ["--tiny", "--epochs", "1", "--train-samples", str(samples),
                           "--batch-size", str(batch), "--dtype", "fp32", "--seed", str(seed)],
                  2, "torchrun", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = steps(tmp_path / "out")[0]["loss"]

    train = _Slice(SyntheticImages((1, 28, 28), 10, seed), samples)
    order = torch.randperm(samples, generator=torch.Generator().manual_seed(seed + 1))
    losses = []
    for rank in range(2):
        torch.manual_seed(seed)
        model = MnistCNN()
        draw_per_rank(seed, rank)
        images, labels = train.batch(order[batch_indices(0, rank, batch, 2) % samples])
        losses.append(torch.nn.functional.cross_entropy(model(images), labels).item())
    assert abs(losses[0] - losses[1]) > 1e-3  # two ranks, two different losses to average
    assert logged == pytest.approx(sum(losses) / 2, rel=1e-4), (logged, losses)
