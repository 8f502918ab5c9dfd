"""The model: a Llama-style decoder (Llama, Mistral, Qwen2 for q/k/v biases, Qwen3 for QK-norm) written
for the trainer, under Hugging Face's parameter names, built on the meta device, sharded, then materialised.

The modules follow transformers' ``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM`` and
``Qwen3ForCausalLM`` operation for operation (RMSNorm in fp32, rotary embeddings in fp32, SDPA attention),
and their state dicts carry the same names (``model.layers.0.self_attn.q_proj.weight``), so a published checkpoint
loads into it and an export loads into transformers. Importing it costs no more than torch:
the trainer does not import transformers (only the tools that write tokenizers, SFT data or
random checkpoints do).

``build_model`` never allocates a whole model in one process: parameters live on the
meta device until :func:`materialize` (after sharding) gives each rank its shards.
The architecture is the starting checkpoint's ``config.json`` (``model_type`` llama, mistral, qwen2 or qwen3),
or from scratch the one the plan describes: Qwen2 when it has q/k/v biases (Qwen2 has no o_proj
bias), Llama otherwise.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from tiered_training.contract.hf_config import check_buildable
from tiered_training.contract.runconfig import ModelConfig
from training.models.attention import Mask, document_mask, sdpa_attention

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

INITIALIZER_RANGE = 0.02
# model_type -> architectures name
MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
}
ROPE_TYPES = ("default", "llama3")
LLAMA3_ROPE = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclass
class LMConfig:
    """The decoder's shape, under the names a Hugging Face ``config.json`` uses.

    ``source`` is the starting checkpoint's config.json, written back (updated) on export, so
    fields the trainer does not use (token ids, ``_name_or_path``) survive a fine-tuning run.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k, before RoPE
    head_size: int | None = None  # config.json's head_dim when it is not hidden_size / num_attention_heads
    attn_implementation: str = (
        "sdpa"  # or "context_parallel" (ring attention, training/distributed/context_parallel.py)
    )
    source: dict = field(default_factory=dict)

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden_size // self.num_attention_heads

    def to_dict(self) -> dict[str, Any]:
        """The config.json: the source's fields, with this shape (peft reads it too)."""
        rope = {"rope_type": "default", **(self.rope_scaling or {}), "rope_theta": self.rope_theta}
        out = {
            key: value
            for key, value in self.source.items()
            if key not in ("rope_scaling", "rope_parameters", "rope_theta")
        }
        out.update(
            architectures=[MODEL_TYPES[self.model_type]],
            model_type=self.model_type,
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            max_position_embeddings=self.max_position_embeddings,
            rms_norm_eps=self.rms_norm_eps,
            rope_parameters=rope,
            tie_word_embeddings=self.tie_word_embeddings,
            hidden_act="silu",
            initializer_range=out.get("initializer_range", INITIALIZER_RANGE),
            attention_dropout=0.0,
        )
        if self.model_type == "llama":
            out.update(attention_bias=self.qkv_bias, mlp_bias=False)
        elif self.model_type == "mistral":
            out.update(sliding_window=None)
        else:
            out.update(use_sliding_window=False, sliding_window=None)
        if self.model_type == "qwen3":
            out.update(attention_bias=self.qkv_bias)
        return out

    def save_pretrained(self, directory: Path, *, dtype: torch.dtype | None = None) -> Path:
        """Write ``config.json`` as transformers reads it, with the weights' dtype."""
        out = self.to_dict()
        out["use_cache"] = True
        if dtype is not None:
            out["dtype"] = str(dtype).removeprefix("torch.")
        path = Path(directory) / "config.json"
        path.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
        return path


def model_type(model: ModelConfig) -> str:
    """The Hugging Face model type of the planned architecture: Qwen3 for q/k norms, Qwen2 for q/k/v biases."""
    if model.qk_norm:
        return "qwen3"
    return "qwen2" if model.qkv_bias else "llama"


def lm_config(model: ModelConfig) -> LMConfig:
    """The decoder of the RunConfig's architecture."""
    return LMConfig(
        model_type=model_type(model),
        vocab_size=model.vocab_size,
        hidden_size=model.hidden_size,
        intermediate_size=model.ffn_size,
        num_hidden_layers=model.layers,
        num_attention_heads=model.attention_heads,
        num_key_value_heads=model.kv_heads,
        max_position_embeddings=model.max_sequence_length,
        rms_norm_eps=model.norm_eps,
        rope_theta=model.rope_theta,
        tie_word_embeddings=model.tied_embeddings,
        qkv_bias=model.qkv_bias,
        o_bias=False,
        qk_norm=model.qk_norm,
        head_size=model.head_size,
    )


def check_matches(config: LMConfig, model: ModelConfig) -> None:
    """A starting checkpoint must have the architecture the plan was made for."""
    found = {
        "num_hidden_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "q/k norms": config.qk_norm,
        "intermediate_size": config.intermediate_size,
        "vocab_size": config.vocab_size,
        "q/k/v bias": config.qkv_bias,
        "o_proj bias": config.o_bias,
        "tie_word_embeddings": config.tie_word_embeddings,
    }
    expected = {
        "num_hidden_layers": model.layers,
        "hidden_size": model.hidden_size,
        "num_attention_heads": model.attention_heads,
        "num_key_value_heads": model.kv_heads,
        "head_dim": model.head_dim,
        "q/k norms": model.qk_norm,
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


def read_config(init_dir: Path) -> LMConfig:
    """The checkpoint's ``config.json`` (a model_type of ``MODEL_TYPES``) as the decoder's shape."""
    file = Path(init_dir) / "config.json"
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{file}: no such file; a Hugging Face checkpoint has a config.json") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{file}: cannot read it as JSON ({exc})") from None
    kind = raw.get("model_type") if isinstance(raw, dict) else None
    if kind not in MODEL_TYPES:
        raise ValueError(f"{file}: model_type {kind!r} is not one the trainer builds ({', '.join(MODEL_TYPES)})")
    check_buildable(raw, file)
    rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = raw.get("rope_theta", rope.pop("rope_theta", 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"{file}: rope type {rope_type!r} is not one the trainer builds ({', '.join(ROPE_TYPES)})")
    missing = [key for key in LLAMA3_ROPE if key not in rope] if rope_type == "llama3" else []
    if missing:
        raise ValueError(f"{file}: llama3 rope scaling needs {', '.join(missing)}")
    heads = raw["num_attention_heads"]
    head_dim = raw.get("head_dim")
    if head_dim is not None and (not isinstance(head_dim, int) or head_dim < 2 or head_dim % 2):
        raise ValueError(f"{file}: head_dim {head_dim!r} is not a positive even integer")
    if kind == "qwen2":
        qkv_bias, o_bias = True, False
    else:  # llama and qwen3: attention_bias puts biases on q, k, v and o; mistral has none
        qkv_bias = o_bias = bool(raw.get("attention_bias", False))
    return LMConfig(
        model_type=kind,
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_hidden_layers=raw["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=raw.get("num_key_value_heads") or heads,
        max_position_embeddings=raw["max_position_embeddings"],
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=float(theta),
        rope_scaling=rope if rope_type != "default" else None,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        qk_norm=kind == "qwen3",
        head_size=head_dim if head_dim != raw["hidden_size"] // heads else None,
        source=raw,
    )


# -- the modules -------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in fp32 (as transformers' LlamaRMSNorm)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_frequencies(config: LMConfig) -> torch.Tensor:
    """RoPE's inverse frequencies; Llama 3.1's ``llama3`` scaling stretches the low frequencies."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    scaling = config.rope_scaling
    if not scaling:
        return inv_freq
    factor, low, high, old_context = (scaling[key] for key in LLAMA3_ROPE)
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_context / high) * ~(wavelen > old_context / low)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """cos and sin of each position's rotation, in fp32, cast to the activations' dtype."""

    inv_freq: torch.Tensor  # a buffer

    def __init__(self, config: LMConfig):
        super().__init__()
        self.config = config
        self.register_buffer("inv_freq", rope_frequencies(config), persistent=False)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


# attn_implementation -> attention function (context_parallel.py adds the ring)
ATTENTION_FUNCTIONS: dict[str, Callable[..., torch.Tensor]] = {"sdpa": sdpa_attention}


class Attention(nn.Module):
    def __init__(self, config: LMConfig):
        super().__init__()
        self.config = config
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        kv = config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv, bias=config.qkv_bias)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, config.hidden_size, bias=config.o_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: Mask | None) -> torch.Tensor:
        shape = (*x.shape[:-1], -1, self.head_dim)
        q, k = self.q_proj(x).view(shape), self.k_proj(x).view(shape)
        if self.config.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        cos, sin = (t.unsqueeze(1) for t in rope)
        q = (q * cos) + (rotate_half(q) * sin)
        k = (k * cos) + (rotate_half(k) * sin)
        out = ATTENTION_FUNCTIONS[self.config.attn_implementation](self, q, k, v, mask, self.scaling)
        return self.o_proj(out.reshape(*x.shape[:-1], -1).contiguous())


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: LMConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: LMConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: Mask | None = None
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    """The trunk: embedding, decoder layers, final norm (transformers' ``LlamaModel``)."""

    def __init__(self, config: LMConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The final hidden states ``[batch, sequence, hidden]``. ``position_ids`` that restart within a
        row mark packed examples, which attend only within themselves (not under context parallelism,
        where they are the positions of this rank's part of each sequence)."""
        x = self.embed_tokens(input_ids)
        mask = None
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=x.device).unsqueeze(0)
        elif self.config.attn_implementation == "sdpa":
            mask = document_mask(position_ids, x.dtype)
        rope = self.rotary_emb(x, position_ids)
        for layer in self.layers:
            x = layer(x, rope, mask)
        return self.norm(x)


class CausalLM(nn.Module):
    """Decoder plus output head, under Hugging Face's names (``model.*``, ``lm_head.weight``)."""

    def __init__(self, config: LMConfig):
        super().__init__()
        self.config = config
        self.model = Decoder(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[batch, sequence, vocab]`` (evaluation; training takes the chunked loss of ``CausalLMLoss``)."""
        return self.lm_head(self.model(input_ids, position_ids))


def check_keys(expected: set[str], found: set[str], init_dir: Path, *, tied: bool = False) -> None:
    """The checkpoint's tensors are exactly the model's: none missing, none the model would not use
    (a tied head's ``lm_head.weight``, the embedding's copy, may be saved or not)."""
    if tied:
        found = found - {"lm_head.weight"}
    missing, unused = sorted(expected - found), sorted(found - expected)
    problems = []
    if missing:
        problems.append(
            f"{len(missing)} tensor(s) the model needs are missing ({', '.join(missing[:4])}"
            f"{', ...' if len(missing) > 4 else ''})"
        )
    if unused:
        problems.append(
            f"{len(unused)} tensor(s) the model does not use ({', '.join(unused[:4])}"
            f"{', ...' if len(unused) > 4 else ''})"
        )
    if problems:
        raise ValueError(f"the init checkpoint {init_dir} does not fit the model: {'; '.join(problems)}")


def build_model(model: ModelConfig, init_dir: Path | None = None) -> CausalLM:
    """The decoder on the meta device (SDPA attention).

    With ``init_dir``, the shape comes from the checkpoint's ``config.json`` (checked
    against the plan); its weights are loaded after sharding by ``export.load_hf_weights``.
    """
    if init_dir is not None:
        config = read_config(init_dir)
        check_matches(config, model)
    else:
        config = lm_config(model)
    with torch.device("meta"):
        return CausalLM(config)


def materialize(lm: CausalLM, device: torch.device, *, seed: int) -> None:
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
    from training.models.nf4 import is_nf4

    lm.to_empty(device=device)
    layers = lm.config.num_hidden_layers
    # QLoRA's NF4 base weights are left to the checkpoint (export.load_hf_weights)
    params = [(name, param) for name, param in lm.named_parameters() if not is_nf4(param)]
    if device.type == "cuda":
        generator_state = torch.get_rng_state()
        torch.manual_seed(seed)
        with torch.no_grad():
            for name, param in params:
                _init_parameter(name, param, layers)
        torch.set_rng_state(generator_state)
    else:
        with torch.no_grad():
            for name, param in params:
                _init_whole_then_slice(name, param, layers, seed)
    reset_rope(lm, device)


def _init_parameter(
    name: str,
    param: torch.Tensor,
    layers: int,
    generator: torch.Generator | None = None,
    *,
    std: float = INITIALIZER_RANGE,
    scale_outputs: bool = True,
) -> None:
    """Norms one, biases zero, every other weight N(0, ``std``); with ``scale_outputs`` (the trainer's
    initialisation) each block's output projections take std / sqrt(2 * layers), without it (transformers')
    they do not."""
    from training.models.lora import base_name, init_adapter, is_adapter

    if is_adapter(name):
        init_adapter(name, param, generator)
        return
    name = base_name(name)  # a LoRA layer's base weight is initialised as the plain layer's
    if name.endswith("norm.weight"):
        nn.init.ones_(param)
    elif name.endswith(".bias"):
        nn.init.zeros_(param)
    else:
        if scale_outputs and name.endswith(("o_proj.weight", "down_proj.weight")):
            std /= math.sqrt(2 * layers)
        nn.init.normal_(param, mean=0.0, std=std, generator=generator)


def _init_whole_then_slice(name: str, param: torch.Tensor, layers: int, seed: int) -> None:
    """Draw the whole parameter on the CPU from a generator of its own; keep this rank's slice."""
    from training.models.lora import base_name

    # the same with or without AC, compile or LoRA
    plain = base_name(name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", ""))
    generator = torch.Generator().manual_seed(seed * 2**32 + zlib.crc32(plain.encode()))
    whole = torch.empty(param.shape, dtype=torch.float32)
    _init_parameter(name, whole, layers, generator)
    if hasattr(param, "device_mesh"):  # a DTensor (FSDP2 shard)
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shard = cast("DTensor", param)
        shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, shard.placements)
        local = shard.to_local()
        if local.numel():
            local.copy_(whole[tuple(slice(o, o + n) for o, n in zip(offset, shape))])
    else:
        param.copy_(whole)


def reset_rope(lm: nn.Module, device: torch.device) -> None:
    """Recompute the rotary embedding's non-persistent ``inv_freq``, which ``to_empty`` leaves as garbage."""
    for module in lm.modules():
        if isinstance(module, RotaryEmbedding):
            module.inv_freq = rope_frequencies(module.config).to(device)


class CausalLMLoss(nn.Module):
    """The training module: the causal LM's trunk plus a chunked loss over its output head.

    FSDP's root is this wrapper, so ``forward`` runs with the root's parameters (embedding,
    final norm, head) gathered. ``self.lm`` stays a plain Hugging Face causal LM with its
    parameter names for checkpoints and export.
    """

    def __init__(self, lm: CausalLM, loss_chunk_tokens: int, loss_group=None):
        super().__init__()
        self.lm = lm
        self.loss_chunk_tokens = loss_chunk_tokens
        self.loss_group = loss_group  # context parallelism: the ranks sharing each sequence

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        divisor: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """position_ids: RoPE positions of ``input_ids`` when they are a part of each sequence
        (context parallelism), or positions restarting at 0 per example in packed SFT sequences
        (the decoder then masks attention per example, ``training/components/packing.py``); default
        ``0 .. len - 1``. divisor: the step's global count of valid labels (training); without it, the
        mean over these labels (validation)."""
        from training.components.loss import chunked_cross_entropy

        hidden = self.lm.model(input_ids, position_ids)
        return chunked_cross_entropy(
            hidden, self.lm.lm_head.weight, labels, self.loss_chunk_tokens, group=self.loss_group, divisor=divisor
        )
