"""A tiny RunConfig and the repo root, shared by the runtime tests."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tiered_training.contract.runconfig import RunConfig  # noqa: E402

TINY = {
    "recipe_name": "tiny-test",
    "model": {
        "name": "tiny",
        "layers": 2,
        "hidden_size": 64,
        "attention_heads": 4,
        "kv_heads": 2,
        "ffn_size": 128,
        "vocab_size": 256,
        "max_sequence_length": 256,
    },
    "parallel": {"sharding": "full", "shard_group_size": 1},
    "precision": {"precision": "fp32", "activation_checkpointing": "none", "loss_chunk_tokens": 64},
    "batch": {
        "sequence_length": 32,
        "micro_batch_size": 2,
        "grad_accum_steps": 1,
        "global_batch_tokens": 64,
        "total_steps": 4,
    },
    "optimizer": {
        "lr": 1e-3,
        "min_lr_ratio": 0.1,
        "warmup_steps": 1,
        "schedule": "cosine",
        "weight_decay": 0.0,
        "grad_clip": 1.0,
        "beta1": 0.9,
        "beta2": 0.95,
    },
    "data": {"token_dtype": "uint16", "seed": 0},
    "checkpoint": {"interval_minutes": 60.0, "keep_last": 1, "shutdown_deadline_seconds": 100},
    "hardware": {
        "instance_type": "ml.p6-b200.48xlarge",
        "gpus_per_node": 8,
        "peak_bf16_flops": 2.25e15,
        "hbm_bytes": 179 * 1024**3,
    },
    "probe": {"steps": 2},
    "metrics": {"namespace": "TieredTraining", "interval_seconds": 60.0, "plan_tokens_per_second_per_gpu": 1000.0},
}


def tiny_config(**overrides) -> RunConfig:
    """The tiny RunConfig; override a whole section (``probe={...}``) or one leaf (``batch__micro_batch_size=4``)."""
    data = {key: (dict(value) if isinstance(value, dict) else value) for key, value in TINY.items()}
    for path, value in overrides.items():
        section, _, leaf = path.partition("__")
        if leaf:
            data[section][leaf] = value
        else:
            data[section] = value
    return RunConfig.model_validate(data)



def run_training_module(tmp_path: Path, cfg: RunConfig, *extra: str, nproc: int = 2, timeout: int = 300):
    """``torchrun --nproc_per_node N -m training --config ...`` over random token shards in tmp_path (gloo, CPU)."""
    import json
    import os
    import subprocess

    import numpy as np

    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for index in range(2):
        rng.integers(0, cfg.model.vocab_size, 20_000).astype(np.uint16).tofile(data / f"shard-{index:05d}.bin")
    config = tmp_path / "hyperparameters.json"
    config.write_text(json.dumps(cfg.to_hyperparameters()))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "--module", "training",
         *extra, "--config", str(config), "--data-dir", str(data), "--checkpoint-dir", str(tmp_path / "ckpt"),
         "--model-dir", str(tmp_path / "model")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout,
    )
