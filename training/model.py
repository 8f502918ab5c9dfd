"""The model: a Hugging Face causal LM (Llama, or Qwen2 for q/k/v biases), built on the meta
device, sharded, then materialised.

``build_model`` never allocates a whole model in one process: parameters live on the
meta device until :func:`materialize` (after sharding) gives each rank its shards.
The class is the one the starting checkpoint's ``config.json`` names (``model_type``), or
from scratch the one the planned architecture describes: Qwen2 when it has q/k/v biases
(Qwen2 has no o_proj bias), Llama otherwise.
"""

from __future__ import annotations

import math
import zlib
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, LlamaConfig, LlamaForCausalLM, PretrainedConfig, Qwen2Config, Qwen2ForCausalLM

from tiered_training.runconfig import ModelConfig

INITIALIZER_RANGE = 0.02

# model_type in a Hugging Face config.json -> (config class, model class)
MODEL_CLASSES = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}


def model_type(model: ModelConfig) -> str:
    """The Hugging Face model type of the planned architecture: Qwen2 for q/k/v biases."""
    return "qwen2" if model.qkv_bias else "llama"


def hf_config(model: ModelConfig) -> PretrainedConfig:
    """The Hugging Face config for the RunConfig's architecture (LlamaConfig or Qwen2Config)."""
    common = dict(
        vocab_size=model.vocab_size,
        hidden_size=model.hidden_size,
        intermediate_size=model.ffn_size,
        num_hidden_layers=model.layers,
        num_attention_heads=model.attention_heads,
        num_key_value_heads=model.kv_heads,
        max_position_embeddings=model.max_sequence_length,
        rms_norm_eps=model.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": model.rope_theta},
        tie_word_embeddings=model.tied_embeddings,
        initializer_range=INITIALIZER_RANGE,
        use_cache=False,
    )
    if model_type(model) == "qwen2":
        return Qwen2Config(**common, use_sliding_window=False)
    return LlamaConfig(**common, attention_bias=False)


def causal_lm_class(config: PretrainedConfig) -> type[nn.Module]:
    return MODEL_CLASSES[config.model_type][1]


def _biases(config: PretrainedConfig) -> tuple[bool, bool]:
    """(q/k/v biases, o_proj bias) of a Llama or Qwen2 config."""
    if config.model_type == "qwen2":
        return True, False
    bias = bool(getattr(config, "attention_bias", False))
    return bias, bias


def check_matches(config: PretrainedConfig, model: ModelConfig) -> None:
    """A starting checkpoint must have the architecture the plan was made for."""
    qkv_bias, o_bias = _biases(config)
    found = {
        "num_hidden_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "intermediate_size": config.intermediate_size,
        "vocab_size": config.vocab_size,
        "q/k/v bias": qkv_bias,
        "o_proj bias": o_bias,
        "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
    }
    expected = {
        "num_hidden_layers": model.layers,
        "hidden_size": model.hidden_size,
        "num_attention_heads": model.attention_heads,
        "num_key_value_heads": model.kv_heads,
        "intermediate_size": model.ffn_size,
        "vocab_size": model.vocab_size,
        "q/k/v bias": model.qkv_bias,
        "o_proj bias": False,
        "tie_word_embeddings": model.tied_embeddings,
    }
    wrong = {k: (found[k], v) for k, v in expected.items() if found[k] != v}
    if wrong:
        detail = ", ".join(f"{k}: checkpoint {got}, plan {want}" for k, (got, want) in wrong.items())
        raise ValueError(f"the init checkpoint does not match the planned architecture ({detail})")


def read_config(init_dir: Path) -> PretrainedConfig:
    """The checkpoint's ``config.json``, as the class its ``model_type`` names (llama or qwen2)."""
    config = AutoConfig.from_pretrained(init_dir)
    if config.model_type not in MODEL_CLASSES:
        raise ValueError(f"{Path(init_dir) / 'config.json'}: model_type {config.model_type!r} is not one the trainer "
                         f"builds ({', '.join(MODEL_CLASSES)})")
    return config


def check_keys(expected: set[str], found: set[str], init_dir: Path, *, tied: bool = False) -> None:
    """The checkpoint's tensors are exactly the model's: none missing, none the model would not use
    (a tied head's ``lm_head.weight``, the embedding's copy, may be saved or not)."""
    if tied:
        found = found - {"lm_head.weight"}
    missing, unused = sorted(expected - found), sorted(found - expected)
    problems = []
    if missing:
        problems.append(f"{len(missing)} tensor(s) the model needs are missing ({', '.join(missing[:4])}"
                        f"{', ...' if len(missing) > 4 else ''})")
    if unused:
        problems.append(f"{len(unused)} tensor(s) the model does not use ({', '.join(unused[:4])}"
                        f"{', ...' if len(unused) > 4 else ''})")
    if problems:
        raise ValueError(f"the init checkpoint {init_dir} does not fit the model: {'; '.join(problems)}")


def build_model(model: ModelConfig, init_dir: Path | None = None) -> nn.Module:
    """A LlamaForCausalLM or Qwen2ForCausalLM on the meta device (SDPA attention, no KV cache).

    With ``init_dir``, the config comes from the checkpoint's ``config.json`` (checked
    against the plan); its weights are loaded after sharding by ``export.load_hf_weights``.
    """
    if init_dir is not None:
        config = read_config(init_dir)
        check_matches(config, model)
        config.use_cache = False
    else:
        config = hf_config(model)
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        lm = causal_lm_class(config)(config)
    return lm


def materialize(lm: nn.Module, device: torch.device, *, seed: int) -> None:
    """Allocate the (sharded) parameters on ``device`` and initialise them.

    Linear and embedding weights: N(0, 0.02), the output projections of each block
    scaled by 1/sqrt(2 * layers) (GPT-2 style); norms: ones; biases: zeros. Then the
    RoPE ``inv_freq`` buffers, which ``to_empty`` leaves as garbage, are recomputed.

    On CUDA, DTensor's random-number tracker gives every shard its own part of one
    stream. Off CUDA there is no tracker (PyTorch's is CUDA-only), and every shard would
    draw the same values; there each parameter is drawn whole from its own generator
    (seeded by ``seed`` and its name) and each rank keeps its slice, so every sharding
    layout, one rank included, starts from the same model.
    """
    lm.to_empty(device=device)
    layers = lm.config.num_hidden_layers
    if device.type == "cuda":
        generator_state = torch.get_rng_state()
        torch.manual_seed(seed)
        with torch.no_grad():
            for name, param in lm.named_parameters():
                _init_parameter(name, param, layers)
        torch.set_rng_state(generator_state)
    else:
        with torch.no_grad():
            for name, param in lm.named_parameters():
                _init_whole_then_slice(name, param, layers, seed)
    reset_rope(lm, device)


def _init_parameter(name: str, param: torch.Tensor, layers: int, generator: torch.Generator | None = None) -> None:
    from .lora import base_name, init_adapter, is_adapter

    if is_adapter(name):
        init_adapter(name, param, generator)
        return
    name = base_name(name)  # a LoRA layer's base weight is initialised as the plain layer's
    if name.endswith("norm.weight"):
        nn.init.ones_(param)
    elif name.endswith(".bias"):
        nn.init.zeros_(param)
    else:
        std = INITIALIZER_RANGE
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            std /= math.sqrt(2 * layers)
        nn.init.normal_(param, mean=0.0, std=std, generator=generator)


def _init_whole_then_slice(name: str, param: torch.Tensor, layers: int, seed: int) -> None:
    """Draw the whole parameter on the CPU from a generator of its own; keep this rank's slice."""
    from .lora import base_name

    # the same with or without AC, compile or LoRA
    plain = base_name(name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", ""))
    generator = torch.Generator().manual_seed(seed * 2**32 + zlib.crc32(plain.encode()))
    whole = torch.empty(param.shape, dtype=torch.float32)
    _init_parameter(name, whole, layers, generator)
    if hasattr(param, "device_mesh"):  # a DTensor (FSDP2 shard)
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
        local = param.to_local()
        if local.numel():
            local.copy_(whole[tuple(slice(o, o + n) for o, n in zip(offset, shape))])
    else:
        param.copy_(whole)


def reset_rope(lm: nn.Module, device: torch.device) -> None:
    """Recompute every rotary embedding's non-persistent ``inv_freq`` (and its original copy)."""
    for module in lm.modules():
        if hasattr(module, "inv_freq") and hasattr(module, "config"):
            rope_type = getattr(module, "rope_type", "default")
            if rope_type == "default":
                inv_freq, scaling = module.compute_default_rope_parameters(module.config)
            else:
                from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

                inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](module.config, device)
            with torch.no_grad():
                module.inv_freq = inv_freq.to(device)
                if hasattr(module, "original_inv_freq"):
                    module.original_inv_freq = inv_freq.clone().to(device)
            module.attention_scaling = scaling


class CausalLMLoss(nn.Module):
    """The training module: the causal LM's trunk plus a chunked loss over its output head.

    FSDP's root is this wrapper, so ``forward`` runs with the root's parameters (embedding,
    final norm, head) gathered. ``self.lm`` stays a plain Hugging Face causal LM with its
    parameter names for checkpoints and export.
    """

    def __init__(self, lm: nn.Module, loss_chunk_tokens: int, loss_group=None):
        super().__init__()
        self.lm = lm
        self.loss_chunk_tokens = loss_chunk_tokens
        self.loss_group = loss_group  # context parallelism: the ranks sharing each sequence

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, position_ids: torch.Tensor | None = None,
                divisor: torch.Tensor | None = None) -> torch.Tensor:
        """position_ids: RoPE positions of ``input_ids`` when they are a part of each sequence
        (context parallelism), or positions restarting at 0 per example in packed SFT sequences
        (transformers then masks attention per example, ``training/packing.py``); default ``0 .. len - 1``. divisor: the step's global count of
        valid labels (training); without it, the mean over these labels (validation)."""
        from .loss import chunked_cross_entropy

        hidden = self.lm.model(input_ids=input_ids, position_ids=position_ids, use_cache=False).last_hidden_state
        return chunked_cross_entropy(hidden, self.lm.lm_head.weight, labels, self.loss_chunk_tokens, group=self.loss_group,
                                     divisor=divisor)
