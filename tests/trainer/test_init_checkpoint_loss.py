"""A run with an init checkpoint starts from that checkpoint's weights, not from a fresh initialisation.

The first step's loss is computed before any update, so it is the checkpoint's loss on the
first batch. It is compared with the same loss computed here by transformers on the loaded
checkpoint: the same bf16 weights (exact in fp32) and the same tokens, only the sums run in
another order (the trainer's chunked loss, FSDP on one rank). Each loss term passes through
at most 10 rounded sums of at most 128 terms, each within 128 u relative (u = 2**-24): the
losses agree within 10 x 128 u = 7.6e-5, relative. A fresh initialisation (other random
weights of the same scale) gives a loss farther than 10 times that (measured: 4e-2 away).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# Threads per worker process; `make determinism` runs these tests with 1 and 2 (and on one CPU).
WORKER_THREADS = os.environ.get("TT_TEST_THREADS", "1")
TOLERANCE = 10 * 128 * 2.0**-24

SCRIPT = """
import json, sys
from pathlib import Path
sys.path[:0] = [{root!r}, {here!r}]
from tiny import tiny_config
from training.paths import Paths
from training.trainer import run
root = Path({tmp!r})
cfg = tiny_config(parallel={{"sharding": "full", "shard_group_size": 1}}, batch={{"total_steps": 1, "global_batch_tokens": 64}})
out = {{}}
for name, init in (("loaded", root / "init"), ("fresh", None)):
    paths = Paths(root / "data", root / f"ck-{{name}}", root / f"model-{{name}}", init)
    out[name] = run(cfg, paths, resume=False, save_checkpoints=False, export=False).losses[1]
(root / "losses.json").write_text(json.dumps(out))
"""


@pytest.mark.torch
def test_first_loss_is_the_init_checkpoints_loss(tmp_path):
    import torch.nn.functional as F
    from tiny import tiny_config, write_learnable_shards
    from transformers import LlamaForCausalLM

    from training.components.data import build_dataloader, split_batch
    from training.models.random_checkpoint import write_random_checkpoint

    cfg = tiny_config(parallel={"sharding": "full", "shard_group_size": 1}, batch={"total_steps": 1, "global_batch_tokens": 64})
    write_learnable_shards(tmp_path / "data", tokens=5000)
    write_random_checkpoint(cfg.model, tmp_path / "init", seed=7, std=0.1)  # far from a uniform prediction
    env = {**os.environ, "OMP_NUM_THREADS": WORKER_THREADS, "PYTHONPATH": str(ROOT)}
    env.pop("RANK", None)
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(root=str(ROOT), here=str(HERE), tmp=str(tmp_path))],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "loading initial weights from" in proc.stderr
    losses = json.loads((tmp_path / "losses.json").read_text())

    lm = LlamaForCausalLM.from_pretrained(tmp_path / "init", torch_dtype=torch.float32).eval()
    loader = build_dataloader(tmp_path / "data", cfg.data.token_dtype, cfg.batch.sequence_length, cfg.batch.micro_batch_size,
                              rank=0, world_size=1, seed=cfg.data.seed, vocab_size=cfg.model.vocab_size)
    inputs, labels = split_batch(next(iter(loader)), torch.device("cpu"))
    with torch.no_grad():
        logits = lm(input_ids=inputs).logits
    expected = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)).item()
    assert losses["loaded"] == pytest.approx(expected, rel=TOLERANCE)
    assert abs(losses["fresh"] - expected) > 10 * TOLERANCE * expected, losses  # not the trainer's own initialisation
