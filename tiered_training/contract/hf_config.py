"""A model's dimensions from a Hugging Face ``config.json`` (``model.hf_config``, ``models --from-config``).

Read as JSON, without transformers: only the model types the trainer builds
(``training/models/decoder.py``: Llama, Mistral, Qwen2 for q/k/v biases, Qwen3 for QK-norm), with the features it
supports; anything else is refused with the field that says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tiered_training.contract.architecture import Architecture
from tiered_training.text import clip

# model_type -> (q/k/v biases, default rope_theta): the model types training/models/decoder.py builds (its MODEL_TYPES).
MODEL_TYPES = {
    "llama": (False, 10000.0),
    "qwen2": (True, 10000.0),
    "qwen3": (False, 10000.0),
    "mistral": (False, 10000.0),
}
MAX_CONFIG_BYTES = 1 << 20


class ConfigError(ValueError):
    """A config.json the planner cannot read or the trainer cannot build; the message names the file and field."""


def config_path(path: str | Path, base: Path | None = None) -> Path:
    """The config.json that ``path`` names: the file, or ``config.json`` in the directory; relative to ``base``."""
    path = Path(path).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    return path / "config.json" if path.is_dir() else path


def read(path: str | Path, base: Path | None = None) -> tuple[str, Architecture]:
    """(display name, architecture) of the config.json at ``path`` (a directory or the file)."""
    file = config_path(path, base)
    try:
        if file.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{file}: larger than {MAX_CONFIG_BYTES:,} bytes; not a config.json")
        config = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"{file}: no such file (give a Hugging Face checkpoint directory or its config.json)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{file}:{exc.lineno}: not JSON ({exc.msg})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{file}: a config.json is a JSON object")
    return _name(config, file), architecture(config, file)


def _name(config: dict[str, Any], file: Path) -> str:
    name = config.get("_name_or_path")
    return str(name) if isinstance(name, str) and name else file.parent.name or "hf-config"


def architecture(config: dict[str, Any], file: Path | str = "config.json") -> Architecture:
    """The Architecture a Llama, Mistral, Qwen2 or Qwen3 config describes; :class:`ConfigError` for any other.
    Qwen3's q/k norms are counted (``qk_norm``), and a ``head_dim`` other than hidden_size / num_attention_heads
    becomes ``head_size``."""
    kind = config.get("model_type")
    if kind not in MODEL_TYPES:
        names = config.get("architectures") or []
        named = f" ({', '.join(map(str, names))})" if isinstance(names, list) and names else ""
        raise ConfigError(
            f"{file}: model_type {clip(repr(kind))}{named} is not one the trainer builds; "
            f"it builds {', '.join(MODEL_TYPES)} (training/models/decoder.py)"
        )
    qkv_bias, default_theta = MODEL_TYPES[kind]

    def need(key: str) -> Any:
        if key not in config:
            raise ConfigError(f"{file}: {key}: missing; a {kind} config.json has it")
        return config[key]

    if kind in ("llama", "qwen3") and config.get("attention_bias"):
        raise ConfigError(
            f"{file}: attention_bias: true gives o_proj a bias the trainer's Llama does not build; "
            "only attention_bias: false is supported"
        )
    check_buildable(config, file)
    heads = need("num_attention_heads")
    hidden = need("hidden_size")
    head_dim = config.get("head_dim")
    if isinstance(heads, int) and isinstance(hidden, int) and heads and head_dim == hidden // heads:
        head_dim = None  # the default width: leave it unstated
    rope_parameters = config.get("rope_parameters")
    rope = rope_parameters if isinstance(rope_parameters, dict) else {}
    theta = config.get("rope_theta", rope.get("rope_theta", default_theta))
    fields = {
        "layers": need("num_hidden_layers"),
        "hidden_size": hidden,
        "attention_heads": heads,
        "kv_heads": config.get("num_key_value_heads") or heads,
        "ffn_size": need("intermediate_size"),
        "vocab_size": need("vocab_size"),
        "tied_embeddings": bool(config.get("tie_word_embeddings", False)),
        "max_sequence_length": need("max_position_embeddings"),
        "rope_theta": float(theta) if isinstance(theta, (int, float)) and not isinstance(theta, bool) else theta,
        "qkv_bias": qkv_bias,
        "norm_eps": config.get("rms_norm_eps", 1e-6),
        "head_size": head_dim,
        "qk_norm": kind == "qwen3",
    }
    keys = {
        "layers": "num_hidden_layers",
        "attention_heads": "num_attention_heads",
        "kv_heads": "num_key_value_heads",
        "ffn_size": "intermediate_size",
        "tied_embeddings": "tie_word_embeddings",
        "max_sequence_length": "max_position_embeddings",
        "norm_eps": "rms_norm_eps",
        "head_size": "head_dim",
    }
    try:
        return Architecture.model_validate(fields, strict=True)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        loc = error["loc"][0] if error["loc"] else ""
        key = keys.get(str(loc), str(loc))
        message = error["msg"].removeprefix("Value error, ")
        message = message[:1].lower() + message[1:]
        where = f"{key}: " if key else ""
        got = f" (got {clip(repr(error.get('input')))})" if key else ""
        raise ConfigError(f"{file}: {where}{message}{got}") from None


def check_buildable(config: dict[str, Any], file: Path | str = "config.json") -> None:
    """:class:`ConfigError` for a feature of a config.json that the trainer's decoder
    (``training/models/decoder.py``) does not build: sliding-window attention, MLP biases, an activation
    other than SwiGLU."""
    kind = config.get("model_type")
    if kind in ("qwen2", "qwen3") and config.get("use_sliding_window"):
        raise ConfigError(
            f"{file}: use_sliding_window: true; the trainer runs full attention only (use_sliding_window: false)"
        )
    if kind == "mistral" and config.get("sliding_window") is not None:
        raise ConfigError(
            f"{file}: sliding_window: {clip(repr(config.get('sliding_window')))}; the trainer runs full attention only "
            "(sliding_window: null, as Mistral 7B v0.3 has)"
        )
    layer_types = config.get("layer_types")
    if kind in MODEL_TYPES and isinstance(layer_types, list) and set(layer_types) - {"full_attention"}:
        others = sorted(set(map(str, layer_types)) - {"full_attention"})
        raise ConfigError(f"{file}: layer_types has {', '.join(others)}; the trainer runs full_attention only")
    if config.get("mlp_bias"):
        raise ConfigError(f"{file}: mlp_bias: true; the trainer builds MLPs without biases")
    if config.get("hidden_act", "silu") != "silu":
        raise ConfigError(
            f"{file}: hidden_act {clip(repr(config.get('hidden_act')))}: the trainer builds SwiGLU (silu) MLPs only"
        )


def catalog_entry(path: str | Path) -> str:
    """The model catalogue entry (YAML, as in ``tiered_training/catalog/models.yaml``) a config.json gives."""
    import yaml

    file = config_path(path)
    name, arch = read(file)
    ident = (
        "".join(c if c.isalnum() or c in ".-" else "-" for c in name.rsplit("/", 1)[-1].lower()).strip("-")
        or "hf-config"
    )
    entry = {
        ident: {
            "display_name": name,
            "source": f"{file} (parameters counted from its shapes)",
            "published_parameters": float(f"{arch.parameters:.4g}"),
            "architecture": arch.model_dump(),
        }
    }
    return yaml.safe_dump(entry, sort_keys=False, default_flow_style=None, width=110)
