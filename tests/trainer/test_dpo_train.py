"""The trainer's DPO step end to end on the CPU, in one process: raw pairs, python -m training.dpo_data, then
training from an init checkpoint, full with the precomputed reference and LoRA with the adapters disabled.
The DPO loss starts at ln 2 (policy = reference), the chosen answers' reward rises above the rejected ones',
held-out pairs are evaluated against the reference, and the export loads in transformers and generates."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from test_multiprocess import ROOT  # noqa: E402
from tiny import tiny_chat_tokenizer  # noqa: E402

STEPS = 12


@pytest.mark.parametrize("adapter", ["none", "lora"])
def test_dpo_trains_the_chosen_answers_reward_above_the_rejected(tmp_path, adapter):
    from tiny import tiny_config

    from training.models.random_checkpoint import write_random_checkpoint
    from training.tools.tiny_pairs import tiny_pairs

    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in tiny_pairs(32)))
    tok = tiny_chat_tokenizer(tmp_path / "init")
    prepared = subprocess.run(
        [sys.executable, "-m", "training.dpo_data", str(data), "--tokenizer", str(tok), "--out",
         str(tmp_path / "prepared"), "--sequence-length", "32"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert prepared.returncode == 0, prepared.stderr
    reference = "adapter_disabled" if adapter == "lora" else "precomputed"
    sft = {"adapter": "none"} if adapter == "none" else {"adapter": "lora", "lora": {"rank": 8, "alpha": 16}}
    cfg = tiny_config(batch={"total_steps": STEPS, "micro_batch_size": 2, "global_batch_tokens": 128},
                      model={"init_checkpoint": "s3://example-bucket/tiny/"}, sft=sft, export={"dtype": "fp32"},
                      parallel={"sharding": "none", "shard_group_size": 1},
                      optimizer={"lr": 1e-2, "min_lr_ratio": 0.1, "warmup_steps": 1, "schedule": "constant",
                                 "weight_decay": 0.0, "grad_clip": 1.0, "beta1": 0.9, "beta2": 0.95},
                      dpo={"loss": "sigmoid", "beta": 0.5, "reference": reference},
                      validation={"source": "holdout", "holdout_every": 4, "batches": 2, "interval_minutes": 1e-6})
    write_random_checkpoint(cfg.model, tmp_path / "init", seed=5)
    (tmp_path / "cfg.json").write_text(cfg.to_json())
    script = textwrap.dedent(f"""
        import json, logging
        from pathlib import Path
        from tiered_training.contract.runconfig import RunConfig
        from training.paths import Paths
        from training.trainer import run
        lines = []
        class Keep(logging.Handler):
            def emit(self, record):
                lines.append(record.getMessage())
        cfg = RunConfig.from_json(Path({str(tmp_path / 'cfg.json')!r}).read_text())
        root = Path({str(tmp_path)!r})
        logging.getLogger("training").addHandler(Keep())
        result = run(cfg, Paths(root / "prepared" / "train", root / "ckpt", root / "model", root / "init"))
        if cfg.dpo.reference == "precomputed":  # a probe's few steps: the reference of the rows they read only
            run(cfg, Paths(root / "prepared" / "train", root / "ckpt-probe", root / "model-probe", root / "init"),
                max_steps=2, resume=False, save_checkpoints=False, export=False)
        precomputed = [l for l in lines if "precomputed" in l]
        metrics = [l for l in lines if "rewards/chosen=" in l and "validation" not in l]
        validation = [l for l in lines if l.startswith("validation DPO loss")]
        out = {{"losses": result.losses, "metrics": metrics, "validation": validation, "precomputed": precomputed}}
        (root / "out.json").write_text(json.dumps(out))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads((tmp_path / "out.json").read_text())
    losses = [out["losses"][str(s)] for s in range(1, STEPS + 1)]
    assert losses[0] == pytest.approx(0.6931, abs=1e-3)  # -log sigmoid(0): the policy starts as its reference
    assert sum(losses[-3:]) / 3 < 0.65, losses
    last = dict(item.split("=") for item in out["metrics"][-1].split()[2:])
    assert float(last["rewards/margins"]) > 0 and float(last["rewards/accuracies"]) >= 0.5, out["metrics"][-1]
    if reference == "precomputed":  # the run: all 32 rows; the probe's 2 steps of 2 micro-batches of 2 rows: 8
        (full, probe) = [int(line.split()[3]) for line in out["precomputed"]]
        assert (full, probe) == (32, 8), out["precomputed"]
    # held-out pairs (every 4th row), evaluated after each step against the starting weights' reference: a
    # reference recomputed from the trained weights would give margins of exactly 0
    assert len(out["validation"]) >= STEPS - 1, out["validation"]
    held_out = dict(item.split("=") for item in out["validation"][-1].split("; eval ")[1].split())
    assert float(held_out["rewards/margins"]) != 0 and 0 <= float(held_out["rewards/accuracies"]) <= 1, held_out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # the export (merged, LoRA merged in) loads with transformers and generates from the chat template
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "model"))
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "model"))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "red green"}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    generated = model.generate(**prompt, max_new_tokens=4, do_sample=False)
    assert generated.shape[1] > prompt["input_ids"].shape[1]
