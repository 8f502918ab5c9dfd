"""The planner's memory model against the real trainer (the planner's accuracy test).

The gate: the peak of a whole training step. ``bench/memory_peak.py`` runs the trainer
on 2 ranks (torchrun, gloo, FSDP2, BF16, the chunked loss, AdamW, two micro-batches per
step) and takes the peak of its second step from PyTorch's ``FSDPMemTracker``; the
planner's ``estimate(...).allocated`` (its total less the fixed CUDA/NCCL reserve and the
allocator's fragmentation, which a CPU step cannot show) must be within 10% of it for
every checkpointing mode.

Activations: for each checkpointing mode, the bytes one decoder layer keeps for backward,
per token, as ``tiered_training.planning.memory.activation_bytes_per_token`` predicts, within 5%
of what the real Hugging Face model (wrapped by ``training.components.ac``) keeps alive.

How it is counted. A TorchDispatchMode sees every tensor any op creates during the
forward and keeps a weak reference to its storage. After the forward, the storages
still alive are exactly what is retained for backward: autograd's saved tensors (no
checkpointing), the selective-checkpoint cache (SAC), or the inputs held by the
checkpoint frames (full). Storages are counted once each, whatever views share them.
Per layer = retained(L=2) - retained(L=1), so embeddings, RoPE tables and the final
norm cancel. For ``none``, ``saved_tensors_hooks`` gives a second, independent count.

Parameter and optimiser-state bytes are compared exactly on real FSDP2 runs in
``test_multiprocess.py`` (rank 0 of a 2-rank full and a 2x2 hybrid mesh).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from tiered_training.contract.architecture import Architecture  # noqa: E402
from tiered_training.planning.memory import activation_bytes_per_token  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SEQ, BATCH = 64, 2
ARCH = dict(hidden_size=128, attention_heads=4, kv_heads=2, ffn_size=352, vocab_size=256, max_sequence_length=256)
# Qwen3's shape: q/k norms, and a head_dim (64) other than hidden / heads (32)
QWEN3 = dict(ARCH, head_size=64, qk_norm=True)


class _Storages(TorchDispatchMode):
    """Weak references to every storage created by an op while active."""

    def __init__(self, exclude=()):
        super().__init__()
        self.created: dict[int, tuple[StorageWeakRef, int]] = {}
        self.exclude = {t.untyped_storage().data_ptr() for t in exclude}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key and (key not in self.created or self.created[key][0].expired()) and key not in self.exclude:
                    self.created[key] = (StorageWeakRef(storage), storage.nbytes())
        return out

    def alive_bytes(self) -> int:
        return sum(size for ref, size in self.created.values() if not ref.expired())


def _model(layers: int, dtype: torch.dtype, mode: str, shape: dict = ARCH):
    from tiered_training.contract.runconfig import ModelConfig
    from training.components.ac import apply_ac
    from training.models.decoder import CausalLM, lm_config

    torch.manual_seed(0)
    lm = CausalLM(lm_config(ModelConfig(name="t", layers=layers, **shape))).to(dtype)
    apply_ac(lm.model.layers, mode)
    return lm


def _retained(layers: int, dtype: torch.dtype, mode: str, shape: dict = ARCH) -> int:
    lm = _model(layers, dtype, mode, shape)
    ids = torch.randint(0, 256, (BATCH, SEQ))
    tracker = _Storages(exclude=[*lm.parameters(), *lm.buffers(), ids])
    with tracker:
        hidden = lm.model(ids)
    assert hidden.requires_grad
    alive = tracker.alive_bytes()
    hidden.sum().backward()  # the retained tensors really serve backward
    return alive


def _bench(module: str):
    """A script of ``bench/`` imported as a module."""
    import importlib

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return importlib.import_module(module)
    finally:
        sys.path.remove(str(ROOT / "bench"))


def _assert_peak_within_10_percent(row: dict, mode: str) -> None:
    measured, planned = row["measured_bytes"], row["planned_bytes"]
    kinds = {k: round(v / 2**20, 2) for k, v in row["measured_by_kind"].items()}
    assert abs(planned - measured) / measured <= 0.10, (
        f"{mode}: planner {planned / 2**20:.2f} MiB ({row['planned']['peak_at']}), "
        f"measured peak {measured / 2**20:.2f} MiB {json.dumps(kinds)}"
    )


def _saved_by_hooks(layers: int, dtype: torch.dtype) -> int:
    """Bytes of the distinct storages autograd saves (a tensor saved by two ops counts once)."""
    lm = _model(layers, dtype, "none")
    return _bench("activations_compiled").autograd_saved_bytes(lm, torch.randint(0, 256, (BATCH, SEQ)))


@pytest.mark.parametrize("shape", [ARCH, QWEN3], ids=["llama", "qwen3"])
@pytest.mark.parametrize("precision,dtype", [("bf16", torch.bfloat16), ("fp32", torch.float32)])
@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_activation_bytes_per_layer(precision, dtype, mode, shape):
    arch = Architecture(layers=1, **shape)
    planned = activation_bytes_per_token(arch, precision, mode) * SEQ * BATCH
    measured = _retained(2, dtype, mode, shape) - _retained(1, dtype, mode, shape)
    assert measured > 0
    assert abs(planned - measured) / measured <= 0.05, (
        f"{precision}/{mode}: planner {planned} B per layer, trainer keeps {measured} B ({planned / measured:.3f}x)"
    )


@pytest.mark.parametrize("precision,dtype", [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_activation_bytes_none_matches_saved_tensors_hooks(precision, dtype):
    arch = Architecture(layers=1, **ARCH)
    planned = activation_bytes_per_token(arch, precision, "none") * SEQ * BATCH
    hooked = _saved_by_hooks(2, dtype) - _saved_by_hooks(1, dtype)
    assert abs(planned - hooked) / hooked <= 0.05, f"planner {planned} B, saved_tensors_hooks {hooked} B"


# -- the whole step --------------------------------------------------------------------


@pytest.fixture(scope="module")
def step_peaks(tmp_path_factory):
    launch = _bench("memory_peak").launch
    out = tmp_path_factory.mktemp("peak") / "peak.json"
    return {row["mode"]: row for row in launch(out)["rows"]}


@pytest.mark.torch
@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_whole_step_peak_matches_planner(step_peaks, mode):
    _assert_peak_within_10_percent(step_peaks[mode], mode)


def test_checkpointing_modes_order_the_step_peak(step_peaks):
    """Selective keeps less than none and more than full, in the trainer as in the planner."""
    measured = [step_peaks[m]["measured_bytes"] for m in ("none", "selective", "full")]
    planned = [step_peaks[m]["planned_bytes"] for m in ("none", "selective", "full")]
    assert measured[0] > measured[1] > measured[2]
    assert planned[0] > planned[1] > planned[2]


# -- LoRA: adapters on a frozen base (training/models/lora.py) ------------------------------------

LORA_ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _lora_retained(layers: int, mode: str, targets: tuple, dropout: float, shape: dict = ARCH) -> int:
    """Bytes a bf16 model with the trainer's adapters and its base frozen keeps for backward after forward."""
    from tiered_training.contract.runconfig import LoraConfig
    from training.components.ac import apply_ac
    from training.models.lora import apply_lora

    lm = _model(layers, torch.float32, "none", shape)
    apply_lora(lm, LoraConfig(rank=16, alpha=32, dropout=dropout, target_modules=list(targets)))
    lm = lm.to(torch.bfloat16).train()

    apply_ac(lm.model.layers, mode)
    ids = torch.randint(0, 256, (BATCH, SEQ))
    tracker = _Storages(exclude=[*lm.parameters(), *lm.buffers(), ids])
    with tracker:
        hidden = lm.model(ids)
    alive = tracker.alive_bytes()
    hidden.sum().backward()
    return alive


@pytest.mark.parametrize("shape", [ARCH, QWEN3], ids=["llama", "qwen3"])
@pytest.mark.parametrize("targets,dropout", [(LORA_ALL, 0.05), (("q_proj", "v_proj"), 0.0)], ids=["all-dropout", "qv"])
@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_lora_activation_bytes_per_layer(mode, targets, dropout, shape):
    """Under LoRA the base keeps only what its input gradients need; the adapters add theirs. The CPU's
    dropout keeps its noise in bf16 (2 bytes), where CUDA's fused kernel keeps a bool mask."""
    from tiered_training.contract.architecture import Lora

    arch = Architecture(layers=1, **shape)
    lora = Lora(16, targets, dropout > 0)
    planned = activation_bytes_per_token(arch, "bf16", mode, lora, mask_bytes=2) * SEQ * BATCH
    measured = _lora_retained(2, mode, targets, dropout, shape) - _lora_retained(1, mode, targets, dropout, shape)
    assert abs(planned - measured) / measured <= 0.05, f"{mode}: planner {planned} B per layer, trainer keeps {measured} B"


@pytest.fixture(scope="module")
def lora_step_peaks(tmp_path_factory):
    launch = _bench("memory_peak").launch
    out = tmp_path_factory.mktemp("peak-lora") / "peak.json"
    return {row["mode"]: row for row in launch(out, lora=16, lora_dropout=0.05)["rows"]}


@pytest.mark.torch
@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_whole_step_peak_matches_planner_under_lora(lora_step_peaks, mode):
    """The trainer's step with rank-16 adapters on every projection (dropout 0.05) and the base frozen:
    the planner's peak (no base gradients or AdamW states, the adapters' own) within 10%."""
    row = lora_step_peaks[mode]
    _assert_peak_within_10_percent(row, mode)
    # The optimiser holds the adapters' AdamW moments only: 8 bytes per sharded adapter element (and a
    # 4-byte step count per tensor, which the planner leaves out).
    assert row["measured_by_kind"]["OptState"] == pytest.approx(row["planned"]["optimizer_states"], rel=1e-3)
    # The sharded parameters: the frozen base in bf16 (2 bytes each) and the fp32 adapters, as planned.
    assert row["measured_by_kind"]["Sharded Param"] == pytest.approx(row["planned"]["parameters"], rel=1e-3)
