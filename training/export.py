"""Export the final weights as a Hugging Face checkpoint (config.json + safetensors).

Every rank writes its shards through ``dcp.HuggingFaceStorageWriter``; with
consolidation the result is ordinary safetensors that ``from_pretrained`` reloads exactly.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.tensor import DTensor


def hf_state_dict(lm: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The (sharded) state dict under Hugging Face names; a tied head is left out, as HF saves it."""
    state = get_model_state_dict(lm)
    if getattr(lm.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    return {key: _plain(value) for key, value in state.items()}


def _plain(value: torch.Tensor) -> torch.Tensor:
    """Unwrap torchao's float8 weight wrappers so plain tensors are written."""
    if isinstance(value, DTensor):
        local = value.to_local()
        if type(local) is not torch.Tensor and hasattr(local, "_tensor"):
            return DTensor.from_local(local._tensor, value.device_mesh, value.placements, run_check=False,
                                      shape=value.shape, stride=value.stride())
        return value
    if type(value) is not torch.Tensor and hasattr(value, "_tensor"):
        return value._tensor
    return value


def export_hf(lm: torch.nn.Module, model_dir: Path, *, dtype: torch.dtype | None = None) -> Path:
    """Write ``lm`` (any sharding) to ``model_dir`` as config.json + model safetensors; collective."""
    model_dir = Path(model_dir)
    rank = dist.get_rank()
    if rank == 0:
        model_dir.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    state = hf_state_dict(lm)
    if dtype is not None:
        state = {k: v.to(dtype) for k, v in state.items()}
    dcp.save(state, storage_writer=HuggingFaceStorageWriter(str(model_dir), save_distributed=True, enable_consolidation=True))
    if rank == 0:
        config = lm.config
        config.architectures = [type(lm).__name__]
        config.use_cache = True
        config.dtype = dtype or next(iter(state.values())).dtype
        config.save_pretrained(model_dir)
        shutil.rmtree(model_dir / "sharded", ignore_errors=True)
    dist.barrier()
    return model_dir


def load_hf_weights(lm: torch.nn.Module, init_dir: Path) -> None:
    """Load a Hugging Face safetensors checkpoint into the already sharded ``lm``; collective."""
    state = hf_state_dict(lm)
    dcp.load(state, storage_reader=HuggingFaceStorageReader(str(init_dir)))
    tied = getattr(lm.config, "tie_word_embeddings", False)
    set_model_state_dict(lm, state, options=StateDictOptions(strict=not tied))
