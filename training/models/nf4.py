"""QLoRA's frozen base: the adapted projections' weights in NF4 (Dettmers et al. 2023,
https://arxiv.org/abs/2305.14314) through torchao's ``NF4Tensor``, as torchtune does under FSDP2.

:func:`quantize_base` turns each LoRA layer's ``base_layer.weight`` into an ``NF4Tensor`` on the meta device,
before sharding; FSDP2 shards it on dim 0 and gathers its codes, scales and factors (NF4Tensor implements
``fsdp_pre_all_gather`` and ``fsdp_post_all_gather``). ``nn.Linear`` runs it through torchao's ``linear_nf4``:
the weight is dequantised to the input's dtype when the projection runs, forward and backward, and never
takes a gradient. :func:`load_quantized` fills the shards from the checkpoint: each weight is read whole,
quantised once (so every rank's shard comes from the same scales) and split as FSDP2 splits it.

The quantisation is torchao's default: blocks of 64 elements with an absmax scale each, the scales
double-quantised to int8 in blocks of 256 (``NF4_BLOCK``, ``NF4_SCALER_BLOCK``). A weight must hold a
whole number of 64 x 256 blocks on every rank of its shard group (:func:`check_shardable`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

NF4_BLOCK = 64
NF4_SCALER_BLOCK = 256


def _nf4() -> Any:
    from torchao.quantization.quantize_.workflows.nf4 import nf4_tensor

    return nf4_tensor


def is_nf4(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` (or a DTensor's local shard) is an NF4Tensor."""
    local = getattr(tensor, "_local_tensor", tensor)
    return type(local).__name__ == "NF4Tensor"


def quantized_bases(lm: nn.Module) -> dict[str, nn.Linear]:
    """``{name: base layer}`` of every LoRA layer (``*.base_layer``)."""
    from training.models.lora import LoraLinear

    return {f"{name}.base_layer": m.base_layer for name, m in lm.named_modules() if isinstance(m, LoraLinear)}


def check_shardable(lm: nn.Module, group: int) -> None:
    """A ValueError naming the first projection whose weight does not split into whole NF4 scale blocks
    over ``group`` ranks (FSDP2 splits dim 0 evenly; NF4Tensor splits its codes, scales and factors with it)."""
    unit = NF4_BLOCK * NF4_SCALER_BLOCK
    for name, base in quantized_bases(lm).items():
        rows, cols = base.weight.shape
        if rows % group or (rows * cols) % (unit * group):
            raise ValueError(
                f"QLoRA: {name.removesuffix('.base_layer')} is {rows} x {cols}; NF4 under FSDP2 needs its rows to "
                f"divide by the shard group ({group}) and its elements by {unit} x {group} "
                f"(blocks of {NF4_BLOCK}, scales double-quantised in blocks of {NF4_SCALER_BLOCK}); use "
                "tuning.adapter: lora, or a shard group that divides them"
            )


def quantize_base(lm: nn.Module) -> nn.Module:
    """Give each LoRA layer's frozen base weight NF4 storage (on the meta device, before sharding)."""
    to_nf4 = _nf4().to_nf4
    for base in quantized_bases(lm).values():
        if base.bias is not None:
            base.bias.requires_grad_(False)
        weight = base.weight.detach().to(torch.bfloat16)
        base.weight = nn.Parameter(to_nf4(weight, NF4_BLOCK, NF4_SCALER_BLOCK), requires_grad=False)
    return lm


def dequantized(weight: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A whole weight as plain values: an NF4 weight dequantised, any other cast."""
    if is_nf4(weight):
        return weight.get_original_weight().to(dtype)  # type: ignore[attr-defined]
    return weight.to(dtype)


def load_quantized(lm: nn.Module, init_dir: Path) -> None:
    """Fill every NF4 base weight from the Hugging Face checkpoint in ``init_dir``: read whole, quantised
    once, and this rank's shard kept (FSDP2 picks the new shard up through its load_state_dict hook)."""
    from safetensors import safe_open
    from torch.distributed.tensor import DTensor

    to_nf4 = _nf4().to_nf4
    files: dict[str, Path] = {}
    for path in sorted(Path(init_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            files.update(dict.fromkeys(f.keys(), path))
    for name, base in quantized_bases(lm).items():
        plain = name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")
        key = plain.removesuffix(".base_layer") + ".weight"
        with safe_open(str(files[key]), framework="pt") as f:
            whole = f.get_tensor(key)
        param = base.weight
        device = param.device
        quantized = to_nf4(whole.to(device=device, dtype=torch.bfloat16), NF4_BLOCK, NF4_SCALER_BLOCK)
        if isinstance(param, DTensor):
            mesh = param.device_mesh
            dim = next(i for i, p in enumerate(param.placements) if p.is_shard())  # HSDP: replicate, then shard
            local = torch.chunk(quantized, mesh.size(dim), dim=0)[mesh.get_local_rank(dim)]
            value: torch.Tensor = DTensor.from_local(local, mesh, param.placements, run_check=False)
        else:
            value = quantized
        base.load_state_dict({"weight": nn.Parameter(value, requires_grad=False)}, strict=False, assign=True)
