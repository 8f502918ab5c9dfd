"""Export a checkpoint from one process (one host), and compare it with a multi-host export.

    python tests/rehearse/single_host_export.py CHECKPOINT_DIR[,MORE_DIRS] MULTI_HOST_EXPORT OUT_DIR

The checkpoint's files may be spread over several host directories (comma-separated); they are
merged first. Prints ``LOGITS EQUAL`` when every tensor and the logits of a fixed input agree.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from transformers import LlamaForCausalLM

from tiered_training.contract.runconfig import RunConfig
from training.distributed.dist import init_distributed
from training.export import export_hf, plain_tensor
from training.trainer import build


def main() -> None:
    sources, multi, out = sys.argv[1].split(","), Path(sys.argv[2]), Path(sys.argv[3])
    merged = out / "checkpoint"
    merged.mkdir(parents=True)
    for source in sources:
        for file in Path(source).iterdir():
            if file.is_file() and not (merged / file.name).exists():
                shutil.copy(file, merged / file.name)
    config = Path(sources[0]).parents[1] / "input/config/hyperparameters.json"
    cfg = RunConfig.from_hyperparameters(json.loads(config.read_text()))
    cfg = cfg.model_copy(update={"parallel": cfg.parallel.model_copy(update={"sharding": "full", "shard_group_size": 1})})
    info = init_distributed()
    trainer = build(cfg, info=info)
    state = {"model": {k: plain_tensor(v) for k, v in get_model_state_dict(trainer.model).items()}}
    dcp.load(state, checkpoint_id=str(merged))
    set_model_state_dict(trainer.model, state["model"])
    single = export_hf(trainer.lm, out / "model", dtype=torch.bfloat16, max_shard_bytes=10**12)
    a = LlamaForCausalLM.from_pretrained(single).eval()
    b = LlamaForCausalLM.from_pretrained(multi).eval()
    sa, sb = a.state_dict(), b.state_dict()
    assert set(sa) == set(sb), set(sa) ^ set(sb)
    for name in sa:
        assert sa[name].shape == sb[name].shape and sa[name].dtype == sb[name].dtype, name
        assert torch.equal(sa[name], sb[name]), name
    ids = torch.randint(0, cfg.model.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(a(ids).logits, b(ids).logits)
    print("LOGITS EQUAL", flush=True)


if __name__ == "__main__":
    main()
