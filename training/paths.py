"""Where the trainer reads data and writes checkpoints and the final model.

Defaults are SageMaker's; each can be overridden by a flag or an environment variable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tiered_training.contract.container import (
    CHECKPOINT_LOCAL_PATH,
    HYPERPARAMETERS_FILE,
    MODEL_CHANNEL,
    MODEL_DIR,
    TRAIN_CHANNEL,
    channel_dir,
)

__all__ = ["DEFAULTS", "HYPERPARAMETERS_FILE", "Paths"]

DEFAULTS = {
    "data_dir": ("TT_DATA_DIR", "SM_CHANNEL_TRAIN", channel_dir(TRAIN_CHANNEL)),
    "checkpoint_dir": ("TT_CHECKPOINT_DIR", None, CHECKPOINT_LOCAL_PATH),
    "model_dir": ("TT_MODEL_DIR", "SM_MODEL_DIR", MODEL_DIR),
    "init_dir": ("TT_INIT_DIR", "SM_CHANNEL_MODEL", channel_dir(MODEL_CHANNEL)),
}


@dataclass(frozen=True)
class Paths:
    data_dir: Path
    checkpoint_dir: Path
    model_dir: Path
    init_dir: Path | None = None  # a Hugging Face checkpoint to start from (config.json + safetensors)

    @classmethod
    def resolve(cls, **overrides: str | os.PathLike | None) -> Paths:
        """Flag value, else ``TT_*`` environment variable, else SageMaker's variable, else the default."""
        values = {}
        for field, (env, sm_env, default) in DEFAULTS.items():
            value = overrides.get(field)
            if value is None:
                value = os.environ.get(env) or (os.environ.get(sm_env) if sm_env else None) or default
            values[field] = Path(value)
        return cls(**values)

    def init_checkpoint(self) -> Path | None:
        """The init directory, if it holds a Hugging Face checkpoint, or the checkpoint of the one export archive
        (an earlier run's model.tar.gz) it holds, unpacked (``training/init_archive.py``)."""
        if self.init_dir is None:
            return None
        from training.init_archive import unpacked

        init = unpacked(self.init_dir)
        return init if (init / "config.json").is_file() else None
