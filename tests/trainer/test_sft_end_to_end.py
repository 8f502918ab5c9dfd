"""Fine-tuning end to end on the CPU: a chat JSONL file, ``python -m training.sft_data``, then a
full-parameter SFT run under ``torchrun`` (2 gloo ranks, FSDP) from an init checkpoint; a run
stopped by SIGTERM and resumed gives the uninterrupted run's losses and weights bit for bit, and
the exported model loads with transformers and gives the trainer's loss on the packed batches.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from test_multiprocess import ROOT, then, torchrun  # noqa: E402
from tiny import tiny_chat_jsonl, tiny_chat_tokenizer, tiny_config  # noqa: E402

pytestmark = pytest.mark.torch

STEPS = 8
SEQ = 32  # tiny_config's sequence length


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    """Prepared data and an init checkpoint, then one launch: the uninterrupted run, and a run stopped by
    SIGTERM after step 3 (last: the signal ends the launch)."""
    from training.models.random_checkpoint import write_random_checkpoint

    root = tmp_path_factory.mktemp("sft")
    chat = tiny_chat_jsonl(root / "chat.jsonl", 48)
    tokenizer = tiny_chat_tokenizer(root / "tokenizer")
    prepared = subprocess.run(
        [sys.executable, "-m", "training.sft_data", str(chat), "--tokenizer", str(tokenizer), "--out", str(root / "prepared"),
         "--sequence-length", str(SEQ), "--overlong", "drop"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert prepared.returncode == 0, prepared.stderr
    assert prepared.stdout.startswith("train: ") and "dropped" in prepared.stdout
    cfg = tiny_config(model={"init_checkpoint": "s3://example-bucket/tiny/"}, sft={"adapter": "none"})
    write_random_checkpoint(cfg.model, root / "init", seed=5)
    common = ["--root", str(root), "--steps", str(STEPS), "--sft-data", str(root / "prepared" / "train"),
              "--init", str(root / "init")]
    first = torchrun(2, *then("train", *common, "--ckpt", root / "ck-term", "--model", root / "m-term",
                              "--out", root / "term1.json", "--sigterm-after", "3"),
                     "train", *common, "--ckpt", str(root / "ck-full"), "--model", str(root / "model"),
                     "--out", str(root / "full.json"), "--dump-full", str(root / "full.pt"),
                     "--loss-sums", str(root / "sums.pt"), check=False)
    assert (root / "full.json").is_file(), f"torchrun failed ({first.returncode}):\n{first.stderr[-8000:]}"
    return root, common, json.loads((root / "full.json").read_text()), first


def test_sft_resume_after_sigterm_is_bit_identical(sft):
    root, common, full, first = sft
    assert full["step"] == STEPS and len(full["losses"]) == STEPS
    stopped = json.loads((root / "term1.json").read_text())
    assert stopped["stopped"] and 3 <= stopped["step"] < STEPS, first.stderr[-3000:]
    torchrun(2, "train", *common, "--ckpt", str(root / "ck-term"), "--model", str(root / "m-term"),
             "--out", str(root / "term2.json"), "--dump-full", str(root / "term.pt"))
    resumed = json.loads((root / "term2.json").read_text())
    assert resumed["resumed_from"] == stopped["step"] and resumed["step"] == STEPS
    assert {**stopped["losses"], **resumed["losses"]} == full["losses"]  # bit for bit: JSON keeps every digit
    a, b = torch.load(root / "full.pt"), torch.load(root / "term.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    from safetensors.torch import load_file  # and training moved the weights away from the init checkpoint

    start = {k: v for f in sorted((root / "init").glob("*.safetensors")) for k, v in load_file(f).items()}
    assert start.keys() <= a.keys() and not any(torch.equal(a[k], start[k].float()) for k in start if k.endswith("proj.weight"))


def test_the_export_loads_with_transformers_and_gives_the_trainers_loss(sft):
    """The fp32 export holds the trained weights exactly, and transformers' forward on the packed
    validation batches (masks, per-example positions) gives the trainer's loss sums. Tolerance:
    each loss term passes through at most 10 rounded sums of at most 128 terms (2 layers, the head,
    the softmax), so the sums agree within 10 x 128 u relative (u = 2**-24), as in test_multiprocess.
    ``use_cache=False`` as the trainer calls it: with a cache (transformers' default) the masks do not
    find the packed examples from the positions, and a sequence of two examples leaks between them."""
    from transformers import AutoModelForCausalLM

    root, _, _, _ = sft
    exported = AutoModelForCausalLM.from_pretrained(root / "model", dtype=torch.float32).eval()
    trained = torch.load(root / "full.pt")
    state = exported.state_dict()
    assert set(trained) <= set(state)
    assert all(torch.equal(state[k], trained[k].float()) for k in trained)
    checked = 0
    for rank in (0, 1):
        saved = torch.load(root / f"sums.pt.rank{rank}")
        for batch, expected in zip(saved["batches"], saved["sums"]):
            with torch.no_grad():
                logits = exported(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1),
                                                     ignore_index=-100, reduction="sum").item()
            assert loss == pytest.approx(expected, rel=10 * 128 * 2.0**-24)
            checked += 1
    assert checked >= 2
