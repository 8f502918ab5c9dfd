"""A Llama-style decoder's dimensions and the parameter shapes they imply.

One class for the recipe's explicit dimensions, the model catalogue and the
RunConfig, so the planner, the container and the docs agree on every shape.
The shapes follow transformers' ``LlamaForCausalLM`` (and Qwen2/Mistral, which
differ only in bias and sizes), in module order.
"""

from dataclasses import dataclass
from math import prod
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer, model_validator


class Architecture(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    layers: int = Field(ge=1, le=512)
    hidden_size: int = Field(ge=64, le=65536)
    attention_heads: int = Field(ge=1, le=1024)
    kv_heads: int = Field(ge=1, le=1024)
    ffn_size: int = Field(ge=64, le=262144)
    vocab_size: int = Field(ge=256, le=1_048_576)
    tied_embeddings: bool = False
    max_sequence_length: int = Field(default=131072, ge=128, le=1_048_576)
    rope_theta: float = Field(default=500000.0, gt=0)
    qkv_bias: bool = False
    norm_eps: float = Field(default=1e-5, gt=0, lt=1)
    head_size: int | None = Field(
        default=None,
        ge=8,
        le=1024,
        description="the width of one attention head (config.json's head_dim); default hidden_size / attention_heads",
    )
    qk_norm: bool = Field(default=False, description="an RMSNorm over each head of q and k (Qwen3)")

    @model_serializer(mode="wrap")
    def _without_defaults(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """``head_size`` and ``qk_norm`` appear only when set, so that the plans and RunConfigs of
        other models stay as they were."""
        out: dict[str, Any] = handler(self)
        for key, default in (("head_size", None), ("qk_norm", False)):
            if out.get(key, default) == default:
                out.pop(key, None)
        return out

    @model_validator(mode="after")
    def _heads_divide(self) -> "Architecture":
        if self.head_size is not None and self.head_size % 2:
            raise ValueError(f"head_size (head_dim) {self.head_size} is odd; rotary embeddings need an even head width")
        if self.head_size is None and self.hidden_size % self.attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of attention_heads {self.attention_heads}"
            )
        if self.attention_heads % self.kv_heads:
            raise ValueError(f"attention_heads {self.attention_heads} is not a multiple of kv_heads {self.kv_heads}")
        return self

    @property
    def head_dim(self) -> int:
        return self.head_size if self.head_size is not None else self.hidden_size // self.attention_heads

    @property
    def q_size(self) -> int:
        """n_heads * head_dim: the width of Q and of the attention output."""
        return self.attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """n_kv_heads * head_dim: the width of K and V."""
        return self.kv_heads * self.head_dim

    def layer_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """Parameter shapes of one decoder layer, in module order."""
        h, kv, f, q = self.hidden_size, self.kv_size, self.ffn_size, self.q_size
        shapes: list[tuple[str, tuple[int, ...]]] = [("input_layernorm.weight", (h,))]
        shapes.append(("self_attn.q_proj.weight", (q, h)))
        if self.qkv_bias:
            shapes.append(("self_attn.q_proj.bias", (q,)))
        shapes.append(("self_attn.k_proj.weight", (kv, h)))
        if self.qkv_bias:
            shapes.append(("self_attn.k_proj.bias", (kv,)))
        shapes.append(("self_attn.v_proj.weight", (kv, h)))
        if self.qkv_bias:
            shapes.append(("self_attn.v_proj.bias", (kv,)))
        shapes.append(("self_attn.o_proj.weight", (h, q)))
        if self.qk_norm:
            shapes += [("self_attn.q_norm.weight", (self.head_dim,)), ("self_attn.k_norm.weight", (self.head_dim,))]
        shapes += [
            ("post_attention_layernorm.weight", (h,)),
            ("mlp.gate_proj.weight", (f, h)),
            ("mlp.up_proj.weight", (f, h)),
            ("mlp.down_proj.weight", (h, f)),
        ]
        return shapes

    def root_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """Parameters outside the decoder layers: embedding, final norm, output head."""
        shapes = [
            ("model.embed_tokens.weight", (self.vocab_size, self.hidden_size)),
            ("model.norm.weight", (self.hidden_size,)),
        ]
        if not self.tied_embeddings:
            shapes.append(("lm_head.weight", (self.vocab_size, self.hidden_size)))
        return shapes

    def projection_sizes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each projection of one layer, by peft's module name."""
        h, kv, f, q = self.hidden_size, self.kv_size, self.ffn_size, self.q_size
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, f),
            "up_proj": (h, f),
            "down_proj": (f, h),
        }

    def lora_shapes(self, rank: int, targets: tuple[str, ...] | list[str]) -> list[tuple[str, tuple[int, ...]]]:
        """The LoRA adapters of one layer (peft: ``lora_A`` is rank x in, ``lora_B`` out x rank)."""
        sizes = self.projection_sizes()
        shapes: list[tuple[str, tuple[int, ...]]] = []
        for name in targets:
            fan_in, fan_out = sizes[name]
            shapes += [(f"{name}.lora_A.weight", (rank, fan_in)), (f"{name}.lora_B.weight", (fan_out, rank))]
        return shapes

    @property
    def layer_parameters(self) -> int:
        return sum(prod(shape) for _, shape in self.layer_shapes())

    @property
    def root_parameters(self) -> int:
        return sum(prod(shape) for _, shape in self.root_shapes())

    @property
    def parameters(self) -> int:
        return self.layers * self.layer_parameters + self.root_parameters

    @property
    def embedding_parameters(self) -> int:
        return self.vocab_size * self.hidden_size

    def flops_per_token(self, sequence_length: int, *, causal: bool = False, lora: "Lora | None" = None) -> float:
        """Training FLOPs per token: 6*N + 12*L*q*s (PaLM appendix B, torchtitan's convention, with q the width
        of Q, n_heads * head_dim, which is h unless head_dim is set),
        which counts full attention; ``causal``: 6*N + 6*L*h*s, the attention a causal mask
        leaves (half the scores and their products with V).

        N counts every matmul weight, the output head included (also when it is
        tied to the embedding), and leaves out the embedding lookup.
        ``lora``: the frozen base runs forward (2N) and the input gradients (2N) but no weight
        gradients, 4N, and the adapters train fully (6 per adapter parameter); attention is as before.
        """
        matmul_params = self.layers * self.layer_parameters + self.embedding_parameters
        attention = (6.0 if causal else 12.0) * self.layers * self.q_size * sequence_length
        if lora is not None:
            return 4.0 * matmul_params + 6.0 * lora.parameters(self) + attention
        return 6.0 * matmul_params + attention


def sharded_elements(shapes: list[tuple[str, tuple[int, ...]]], group: int) -> int:
    """Elements that the first rank holds when FSDP2 shards each tensor on dim 0 over ``group`` ranks.

    FSDP2 gives each rank ``ceil(dim0 / group)`` rows; rank 0 always holds a full chunk,
    so this is the largest per-rank share.
    """
    total = 0
    for _, shape in shapes:
        rows = -(-shape[0] // group)
        total += min(rows, shape[0]) * prod(shape[1:])
    return total


@dataclass(frozen=True)
class Lora:
    """The adapters the planner accounts for: rank, target projections, whether dropout is on, and whether
    the frozen base's projections are quantised to NF4 (QLoRA)."""

    rank: int
    targets: tuple[str, ...]
    dropout: bool = True
    quantized: bool = False

    def layer_elements(self, arch: Architecture) -> int:
        return sum(prod(shape) for _, shape in arch.lora_shapes(self.rank, self.targets))

    def parameters(self, arch: Architecture) -> int:
        """Trainable parameters of the whole model."""
        return arch.layers * self.layer_elements(arch)
