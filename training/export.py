"""Export the final weights as a Hugging Face checkpoint (config.json + safetensors), on any number of hosts,
ready to serve: with the starting checkpoint's tokenizer files and chat template, and a ``generation_config.json``
(``serving_files``), so ``transformers.pipeline("text-generation", DIR)`` and ``vllm serve DIR`` load the folder.

Each weight is gathered whole on rank 0 one at a time (``DTensor.full_tensor``, a collective
over all ranks), cast to the export dtype (``export.dtype``, bf16 by default) and written by
rank 0 into safetensors files of at most ``export.max_shard_bytes``: ``model.safetensors``
when one file holds everything, else ``model-00001-of-0000N.safetensors`` files and a
``model.safetensors.index.json`` weight map, as Hugging Face shards a large model. Only rank 0's
host writes, so the export does not depend on which files each host's disk holds, and rank 0
never holds more than one shard file's worth of weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import HuggingFaceStorageReader
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.tensor import DTensor

if TYPE_CHECKING:
    from training.models.decoder import CausalLM


def hf_state_dict(lm: CausalLM) -> dict[str, torch.Tensor]:
    """The (sharded) state dict under Hugging Face names; a tied head is left out, as HF saves it."""
    state: dict[str, Any] = get_model_state_dict(lm)  # a model's: tensors (DTensors when sharded)
    if lm.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return {key: plain_tensor(value) for key, value in state.items()}


def plain_tensor(value: torch.Tensor) -> torch.Tensor:
    """Unwrap torchao's float8 weight wrappers so plain tensors are written."""
    if isinstance(value, DTensor):
        local = value.to_local()
        if type(local) is not torch.Tensor and hasattr(local, "_tensor"):
            return DTensor.from_local(
                local._tensor,
                value.device_mesh,
                value.placements,
                run_check=False,
                shape=value.shape,
                stride=value.stride(),
            )
        return value
    if type(value) is not torch.Tensor and hasattr(value, "_tensor"):
        return value._tensor
    return value


SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def export_hf(
    lm: CausalLM,
    model_dir: Path,
    *,
    dtype: torch.dtype | None = torch.bfloat16,
    max_shard_bytes: int = 5 * 10**9,
    init_dir: Path | None = None,
) -> Path:
    """Write ``lm`` (any sharding, any number of hosts) to ``model_dir`` as config.json + safetensors, plus the
    serving files of ``init_dir`` (the starting checkpoint; ``serving_files``); collective."""
    from safetensors.torch import save_file

    model_dir = Path(model_dir)
    rank = dist.get_rank()
    state = hf_state_dict(lm)
    part: dict[str, torch.Tensor] = {}
    part_bytes = total = parts = 0
    if rank == 0:
        model_dir.mkdir(parents=True, exist_ok=True)
        for stale in model_dir.glob("part-*.tmp"):
            stale.unlink()
    for name, full in _full_weights(lm, state):  # every rank takes part in each gather
        if rank != 0:
            continue
        tensor = (full.to(dtype) if dtype is not None else full).detach().to("cpu").contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        if part and part_bytes + nbytes > max_shard_bytes:
            parts += 1
            save_file(part, str(model_dir / f"part-{parts:05d}.tmp"), metadata={"format": "pt"})
            part, part_bytes = {}, 0
        part[name] = tensor
        part_bytes += nbytes
        total += nbytes
    if rank == 0:
        parts += 1
        save_file(part, str(model_dir / f"part-{parts:05d}.tmp"), metadata={"format": "pt"})
        lm.config.save_pretrained(model_dir, dtype=dtype or next(iter(state.values())).dtype)
        _name_files(model_dir, total)
        serving_files(init_dir, model_dir, lm.config.to_dict())
    dist.barrier()
    return model_dir


# The tokenizer and chat template files a Hugging Face checkpoint ships (those present are copied).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)
GENERATION_CONFIG = "generation_config.json"
TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def serving_files(init_dir: Path | None, model_dir: Path, config: dict) -> list[str]:
    """Copy the tokenizer files and chat template of ``init_dir`` (the checkpoint the run started from, whose
    tokenizer prepared the data) into ``model_dir``, with its ``generation_config.json``; without one, write it
    from ``config``'s bos/eos/pad ids and the tokenizer's eos token. Returns the names written."""
    import shutil

    written, end_of_turn = [], None
    if init_dir is not None:
        for name in TOKENIZER_FILES:
            if (Path(init_dir) / name).is_file():
                shutil.copyfile(Path(init_dir) / name, Path(model_dir) / name)
                written.append(name)
        end_of_turn = end_of_turn_id(Path(init_dir))
        if (Path(init_dir) / GENERATION_CONFIG).is_file():
            source = Path(init_dir) / GENERATION_CONFIG
            kept = json.loads(source.read_text(encoding="utf-8"))
            if end_of_turn is None or end_of_turn in _ids(kept.get("eos_token_id")):
                shutil.copyfile(source, Path(model_dir) / GENERATION_CONFIG)
            else:  # a base model's config (end of text only) under a chat template: stop at the end of a turn too
                kept["eos_token_id"] = [*_ids(kept.get("eos_token_id")), end_of_turn]
                (Path(model_dir) / GENERATION_CONFIG).write_text(json.dumps(kept, indent=2, sort_keys=True) + "\n")
            return [*written, GENERATION_CONFIG]
    generation = {key: config[key] for key in TOKEN_IDS if config.get(key) is not None}
    special = _special_token_ids(Path(init_dir)) if init_dir is not None else {}
    for key, token_id in special.items():
        if key == "eos_token_id" and "eos_token_id" in generation:
            known = _ids(generation[key])
            generation[key] = known if token_id in known else [*known, token_id]
        else:
            generation.setdefault(key, token_id)
    if end_of_turn is not None and end_of_turn not in _ids(generation.get("eos_token_id")):
        generation["eos_token_id"] = [*_ids(generation.get("eos_token_id")), end_of_turn]
    if generation:
        (Path(model_dir) / GENERATION_CONFIG).write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n")
        written.append(GENERATION_CONFIG)
    return written


def _ids(value) -> list[int]:
    return [] if value is None else list(value) if isinstance(value, list) else [value]


def end_of_turn_id(tokenizer_dir: Path) -> int | None:
    """The id of the chat template's own end-of-turn token: the first special token the template renders
    after an assistant reply (``<|eot_id|>`` for Llama 3.1, ``<|im_end|>`` for ChatML); None without a
    template or where it renders none. Rendered with jinja2 (the trainer does not import transformers)."""
    try:
        names = json.loads((tokenizer_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
        table = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    template = names.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    if (tokenizer_dir / "chat_template.jinja").is_file():
        template = (tokenizer_dir / "chat_template.jinja").read_text(encoding="utf-8")
    special = {t["content"]: t["id"] for t in table.get("added_tokens", []) if t.get("special")}
    if not isinstance(template, str) or not special:
        return None
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def refuse(message):
            raise ValueError(message)

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.globals["raise_exception"] = refuse
        env.filters["tojson"] = lambda value, **_: json.dumps(value)
        stand_in = "\x00reply\x00"
        tokens = {k: (v.get("content") if isinstance(v, dict) else v) for k, v in names.items() if k.endswith("_token")}
        messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": stand_in}]
        rendered = env.from_string(template).render(messages=messages, add_generation_prompt=False, **tokens)
    except Exception:  # noqa: BLE001 (no jinja2, or a template this rendering cannot run: nothing added)
        return None
    if stand_in not in rendered:
        return None
    after = rendered[rendered.index(stand_in) + len(stand_in) :].lstrip()
    found = [(len(name), token_id) for name, token_id in special.items() if after.startswith(name)]
    return max(found)[1] if found else None


def _special_token_ids(tokenizer_dir: Path) -> dict[str, int]:
    """``{bos_token_id, eos_token_id, pad_token_id}`` of the tokens ``tokenizer_config.json`` names, looked up in
    ``tokenizer.json`` (read as JSON: the trainer does not import transformers)."""
    try:
        names = json.loads((tokenizer_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
        table = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    model_vocab = (table.get("model") or {}).get("vocab")
    vocab = dict(model_vocab) if isinstance(model_vocab, dict) else {}  # BPE and WordLevel; Unigram's is a list
    vocab.update({token["content"]: token["id"] for token in table.get("added_tokens", [])})
    ids = {}
    for key in TOKEN_IDS:
        token = names.get(key.removesuffix("_id"))
        token = token.get("content") if isinstance(token, dict) else token
        if isinstance(token, str) and token in vocab:
            ids[key] = vocab[token]
    return ids


def _full_weights(lm: torch.nn.Module, state: dict[str, torch.Tensor]):
    """``(name, whole tensor)`` one at a time, LoRA adapters merged into their weights (``lora.merged_weights``)."""
    from training.models.lora import has_lora, merged_weights

    if has_lora(lm):
        yield from merged_weights(lm, state)
        return
    for name, value in state.items():
        yield name, value.full_tensor() if isinstance(value, DTensor) else value


def _name_files(model_dir: Path, total: int) -> None:
    """Rename the parts as Hugging Face names them and write the index when there are several."""
    from safetensors import safe_open

    parts = sorted(model_dir.glob("part-*.tmp"))
    for stale in list(model_dir.glob("model*.safetensors")) + list(model_dir.glob(INDEX_FILE)):
        stale.unlink()
    if len(parts) == 1:
        parts[0].rename(model_dir / SINGLE_FILE)
        return
    weight_map = {}
    for number, part in enumerate(parts, start=1):
        name = f"model-{number:05d}-of-{len(parts):05d}.safetensors"
        with safe_open(str(part), framework="pt") as handle:
            weight_map.update(dict.fromkeys(handle.keys(), name))
        part.rename(model_dir / name)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (model_dir / INDEX_FILE).write_text(json.dumps(index, indent=2))


def load_hf_weights(lm: CausalLM, init_dir: Path) -> None:
    """Load a Hugging Face safetensors checkpoint into the already sharded ``lm``; collective.
    Refuses a checkpoint whose tensors are not exactly the model's (``model.check_keys``)."""
    from safetensors import safe_open

    from training.models.decoder import check_keys
    from training.models.lora import base_name, is_adapter
    from training.models.nf4 import is_nf4, load_quantized

    state = hf_state_dict(lm)
    # With LoRA the checkpoint holds the base: its names are the base layers' (q_proj.base_layer.weight
    # is q_proj.weight), and the adapters are not in it (``model.materialize`` initialised them).
    names = {base_name(key): key for key in state if not is_adapter(key)}
    base = {hf: state[key] for hf, key in names.items()}
    found = set()
    for path in sorted(Path(init_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            found.update(f.keys())
    tied = lm.config.tie_word_embeddings
    check_keys(set(base), found, init_dir, tied=tied)
    quantized = {hf for hf, value in base.items() if is_nf4(value)}  # QLoRA: filled by load_quantized
    dcp.load(
        {hf: value for hf, value in base.items() if hf not in quantized},
        storage_reader=HuggingFaceStorageReader(str(init_dir)),
    )
    if quantized:
        load_quantized(lm, init_dir)
    loaded: dict[str, Any] = {key: base[hf] for hf, key in names.items() if hf not in quantized}
    set_model_state_dict(lm, loaded, options=StateDictOptions(strict=not tied and len(loaded) == len(state)))
