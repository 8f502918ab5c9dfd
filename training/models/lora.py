"""LoRA adapters on a frozen base, laid out as peft's (https://huggingface.co/docs/peft).

:func:`apply_lora` replaces each target projection of the decoder, on the meta device before
sharding, by a :class:`LoraLinear`: the frozen ``base_layer`` and the adapters ``lora_A.default``
and ``lora_B.default``, the module and parameter names of peft's ``lora.Linear``, computing what it
computes (``base(x) + B(A(dropout(x))) * alpha / rank``). Only the adapters require gradients, so
the optimiser (built over trainable parameters) holds state for them alone, and FSDP2 shards the
frozen base with them, one unit per decoder layer: FSDP2 reduces gradients only for the
parameters that require them. The trainer imports no peft (nor the transformers it loads); the
tests check against peft itself.

Initialisation is peft's: ``lora_A`` Kaiming-uniform, ``lora_B`` zeros, so the adapted model
starts as the base (``model.materialize`` draws them; the base comes from
``model.init_checkpoint``). The adapter's update is ``alpha / rank * B @ A``.

Exports: :func:`merged_weights` (each adapted weight with its update added, under the base
model's names) and :func:`export_adapter` (peft's ``adapter_config.json`` and
``adapter_model.safetensors``, loadable with ``PeftModel.from_pretrained(base, dir)``).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from tiered_training.contract.runconfig import LoraConfig
from training.models.nf4 import dequantized

ADAPTER = "default"  # peft's adapter name; the one adapter this trainer trains
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # PeftModel.save_pretrained's key prefix


class LoraLinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable rank-``r`` update (peft's ``lora.Linear``, one adapter)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float):
        super().__init__()
        self.base_layer = base
        self.in_features, self.out_features = base.in_features, base.out_features
        kwargs: dict[str, Any] = {"bias": False, "device": base.weight.device, "dtype": base.weight.dtype}
        lora_a, lora_b = nn.Linear(base.in_features, rank, **kwargs), nn.Linear(rank, base.out_features, **kwargs)
        self.lora_A = nn.ModuleDict({ADAPTER: lora_a})
        self.lora_B = nn.ModuleDict({ADAPTER: lora_b})
        self.lora_dropout = nn.ModuleDict({ADAPTER: nn.Dropout(dropout) if dropout > 0 else nn.Identity()})
        self.scaling = {ADAPTER: alpha / rank}
        with torch.no_grad():
            init_adapter(".lora_A.", lora_a.weight)
            init_adapter(".lora_B.", lora_b.weight)

    disabled = False  # adapters_disabled: the base alone (peft's disable_adapter)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.base_layer(x)
        if self.disabled:
            return result
        dtype = result.dtype
        a, b = cast(nn.Linear, self.lora_A[ADAPTER]), cast(nn.Linear, self.lora_B[ADAPTER])
        if x.dtype != a.weight.dtype:
            x = x.to(a.weight.dtype)
        result = result + b(a(self.lora_dropout[ADAPTER](x))) * self.scaling[ADAPTER]
        return result.to(dtype)


@contextlib.contextmanager
def adapters_disabled(lm: nn.Module) -> Iterator[None]:
    """The base model alone while inside, as peft's ``disable_adapter()``: DPO's reference with LoRA."""
    layers = [m for m in lm.modules() if isinstance(m, LoraLinear)]
    for layer in layers:
        layer.disabled = True
    try:
        yield
    finally:
        for layer in layers:
            layer.disabled = False


def adapter_config(lora: LoraConfig, base_model: str | None = None) -> dict:
    """peft's ``adapter_config.json`` for the RunConfig's LoRA: no bias training, peft's initialisation."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": sorted(lora.target_modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "inference_mode": False,
    }


def apply_lora(lm: nn.Module, lora: LoraConfig) -> nn.Module:
    """Put LoRA adapters on ``lm``'s target projections in place (on the meta device, before sharding);
    freeze the rest."""
    linear = {name.rsplit(".", 1)[-1] for name, module in lm.named_modules() if isinstance(module, nn.Linear)}
    missing = sorted(set(lora.target_modules) - linear)
    if missing:
        kind = getattr(getattr(lm, "config", None), "model_type", type(lm).__name__)
        raise ValueError(
            f"sft.lora.target_modules: {', '.join(missing)} is not a linear layer of "
            f"the {kind} model (valid: {', '.join(sorted(linear))})"
        )
    targets = set(lora.target_modules)
    for name, module in list(lm.named_modules()):
        if type(module) is nn.Linear and name.rsplit(".", 1)[-1] in targets:
            parent, _, child = name.rpartition(".")
            setattr(
                lm.get_submodule(parent) if parent else lm,
                child,
                LoraLinear(module, lora.rank, lora.alpha, lora.dropout),
            )
    for name, param in lm.named_parameters():
        param.requires_grad_(is_adapter(name))
    return lm


def store_frozen_base(lm: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Keep the frozen base's parameters in ``dtype`` (bf16 under mixed precision, before sharding): FSDP2
    gathers them in bf16 anyway, and they take no gradient or optimiser step, so fp32 copies would only double
    their memory. The adapters stay fp32. A tied head shares the embedding's parameter and follows it."""
    with torch.no_grad():
        for param in {id(p): p for p in lm.parameters()}.values():
            if not param.requires_grad:
                param.data = param.data.to(dtype)
    return lm


def is_adapter(name: str) -> bool:
    """Whether a parameter (or state-dict key) is a LoRA adapter's."""
    return ".lora_A." in name or ".lora_B." in name


def base_name(name: str) -> str:
    """The Hugging Face name of a base weight inside a LoRA layer.

    ``q_proj.base_layer.weight`` -> ``q_proj.weight``."""
    return name.replace(".base_layer.", ".")


def has_lora(lm: nn.Module) -> bool:
    return any(is_adapter(name) for name, _ in lm.named_parameters())


def init_adapter(name: str, param: torch.Tensor, generator: torch.Generator | None = None) -> None:
    """peft's initialisation (``LoraLayer.reset_lora_parameters``): A Kaiming-uniform, B zeros."""
    if ".lora_B." in name:
        nn.init.zeros_(param)
    else:
        nn.init.kaiming_uniform_(param, a=math.sqrt(5), generator=generator)


def _lora_layers(lm: nn.Module) -> dict[str, LoraLinear]:
    """``{module name: LoRA layer}`` (names without activation-checkpoint or compile wrappers)."""
    return {_plain(name): module for name, module in lm.named_modules() if isinstance(module, LoraLinear)}


def _plain(name: str) -> str:
    return name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")


def _rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _full(value: torch.Tensor) -> torch.Tensor:
    return value.full_tensor() if isinstance(value, DTensor) else value


def merged_weights(lm: nn.Module, state: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor | None]]:
    """``(Hugging Face name, full weight)`` of ``state`` (``export.hf_state_dict``) with every adapter merged:
    ``W + alpha / rank * B @ A``, computed in fp32 (QLoRA: W is the NF4 base dequantised). Each tensor is
    gathered whole (a collective over all ranks, in the same order everywhere); only rank 0 gets values, the
    others ``None``."""
    layers = _lora_layers(lm)
    rank0 = _rank0()
    for name, value in state.items():
        if is_adapter(name):
            continue
        plain = _plain(name)
        module = plain[: -len(".base_layer.weight")] if plain.endswith(".base_layer.weight") else None
        full = _full(value)
        if module is None or module not in layers:
            yield base_name(plain), full if rank0 else None
            continue
        layer = layers[module]
        prefix = name[: -len("base_layer.weight")]
        a = _full(state[f"{prefix}lora_A.{ADAPTER}.weight"])
        b = _full(state[f"{prefix}lora_B.{ADAPTER}.weight"])
        if rank0:  # under QLoRA the base is dequantised from NF4
            merged = dequantized(full) + layer.scaling[ADAPTER] * (b.float() @ a.float())
            yield base_name(plain), merged
        else:
            yield base_name(plain), None


def adapter_weights(lm: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapters as peft saves them (``PeftModel.save_pretrained``): fp32, keys
    ``base_model.model.<module>.lora_A.weight``; gathered whole on rank 0 (a collective)."""
    out = {}
    for name, value in state.items():
        if not is_adapter(name):
            continue
        full = _full(value)
        if _rank0():
            key = PEFT_PREFIX + _plain(name).replace(f".{ADAPTER}.", ".")
            out[key] = full.detach().to("cpu", torch.float32).contiguous()
    return out


def export_adapter(
    lm: nn.Module, state: dict[str, torch.Tensor], lora: LoraConfig, adapter_dir: Path, base_model: str | None = None
) -> Path:
    """Write the adapter in peft's format to ``adapter_dir`` (rank 0 writes); collective."""
    from safetensors.torch import save_file

    adapter_dir = Path(adapter_dir)
    weights = adapter_weights(lm, state)
    if _rank0():
        adapter_dir.mkdir(parents=True, exist_ok=True)
        (adapter_dir / ADAPTER_CONFIG).write_text(json.dumps(adapter_config(lora, base_model), indent=2) + "\n")
        save_file(weights, str(adapter_dir / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    if dist.is_initialized():
        dist.barrier()
    return adapter_dir
