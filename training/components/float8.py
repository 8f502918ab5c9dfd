"""FP8 training through torchao.

- ``tensorwise``: ``Float8Linear`` with dynamic tensorwise scales; with
  ``fp8_all_gather`` FSDP2 all-gathers the weights in float8, and the trainer calls
  :func:`precompute_scales` after each optimiser step (one all-reduce for every amax).
- ``rowwise``: per-row scales (no float8 all-gather: torchao supports it for tensorwise only).
- ``mxfp8``: MX block scaling, Blackwell (sm_100) only; ``emulate=True`` runs it on any
  device through torchao's emulated kernels, for tests.

Filter: ``lm_head`` stays in high precision, and so does every Linear whose input or
output dimension is not a multiple of 16 (the FP8 GEMM's alignment).
"""

from __future__ import annotations

import torch
from torch import nn

from tiered_training.contract.runconfig import PrecisionConfig

ALIGNMENT = 16


class Float8ConfigError(ValueError):
    """An FP8 setting that cannot run."""


def module_filter(module: nn.Module, fqn: str) -> bool:
    """True for the Linear layers that are converted to float8."""
    if not isinstance(module, nn.Linear):
        return False
    if fqn == "lm_head" or fqn.endswith(".lm_head"):
        return False
    if ".lora_A." in fqn or ".lora_B." in fqn:  # LoRA adapters (training/models/lora.py) stay in high precision
        return False
    return module.in_features % ALIGNMENT == 0 and module.out_features % ALIGNMENT == 0


def validate(
    precision: PrecisionConfig, *, sharding: str = "full", device: torch.device | None = None, emulate: bool = False
) -> None:
    """Raise :class:`Float8ConfigError` with a reason for a combination that cannot run."""
    if precision.precision != "fp8":
        if precision.fp8_all_gather:
            raise Float8ConfigError(f"fp8_all_gather needs precision fp8, not {precision.precision}")
        return
    recipe = precision.fp8_recipe or "tensorwise"
    if precision.fp8_all_gather and recipe != "tensorwise":
        raise Float8ConfigError(
            f"fp8_all_gather works with the tensorwise recipe only, not {recipe}: torchao's FSDP float8 "
            "all-gather needs one scale per tensor"
        )
    if precision.fp8_all_gather and sharding == "none":
        raise Float8ConfigError("fp8_all_gather needs sharded parameters (sharding full or hybrid), not none")
    if device is not None and device.type == "cuda" and not emulate:
        major, minor = torch.cuda.get_device_capability(device)
        if recipe == "mxfp8" and major != 10:
            raise Float8ConfigError(
                f"mxfp8 needs a Blackwell GPU (sm_100, e.g. B200/B300); this GPU is sm_{major}{minor}. "
                "Use fp8_recipe tensorwise or rowwise"
            )
        if (major, minor) < (8, 9):
            raise Float8ConfigError(f"FP8 needs sm_89 or newer (Ada, Hopper, Blackwell); this GPU is sm_{major}{minor}")
    elif recipe == "mxfp8" and not emulate:
        raise Float8ConfigError("mxfp8 needs a Blackwell GPU (sm_100); none is present (emulation is for tests only)")


def apply_float8(
    model: nn.Module,
    precision: PrecisionConfig,
    *,
    sharding: str = "full",
    device: torch.device | None = None,
    emulate: bool = False,
) -> list[str]:
    """Swap the filtered Linear layers of ``model`` in place; returns the converted FQNs.

    Call before activation checkpointing and sharding.
    """
    validate(precision, sharding=sharding, device=device, emulate=emulate)
    if precision.precision != "fp8":
        return []
    recipe = precision.fp8_recipe or "tensorwise"
    converted = [fqn for fqn, m in model.named_modules() if module_filter(m, fqn)]
    if recipe == "mxfp8":
        from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe
        from torchao.quantization import quantize_

        name = MXFP8TrainingRecipe.MXFP8_EMULATED_RCEIL if emulate else MXFP8TrainingRecipe.MXFP8_RCEIL
        quantize_(model, MXFP8TrainingOpConfig.from_recipe(name), filter_fn=module_filter)
        return converted
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    if recipe == "tensorwise":
        config = Float8LinearConfig(enable_fsdp_float8_all_gather=precision.fp8_all_gather, emulate=emulate)
    else:
        config = Float8LinearConfig.from_recipe_name("rowwise")
        if emulate:
            import dataclasses

            config = dataclasses.replace(config, emulate=True)
    convert_to_float8_training(model, config=config, module_filter_fn=module_filter)
    return converted


def needs_precompute(precision: PrecisionConfig) -> bool:
    return (
        precision.precision == "fp8"
        and precision.fp8_all_gather
        and (precision.fp8_recipe or "tensorwise") == "tensorwise"
    )


def precompute_scales(model: nn.Module) -> None:
    """After the optimiser step: compute every float8 weight's scale for the next all-gather."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)
