"""Packed SFT sequences: an example packed with others has the loss and the gradients it has alone
(attention stays within each example, positions restart per example), and an SFT step through the
trainer (one gloo rank, FSDP) gives the gradient of the examples run alone.

Tolerances. In float64 every compared value is a chain of about 12 operations (embedding, two
layers of norm, attention and MLP, the final norm, the head and the cross-entropy), each with
sums of at most 256 terms (the vocabulary; widths 64 and 128, 32 positions). A sum of n terms
in any order is within n * eps of the exact sum, relative to the sum of the terms' magnitudes
(Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., section 3.1), so two
orders (packed with a mask or alone with ``is_causal``, one thread or two) differ by at most
about 12 * 256 * eps relative to the values' norm: ``TOL64``. The trainer's step runs in float32:
``TOL32`` is the same bound with float32's eps. A leak across examples moves the loss or the
logits by far more (the leak test checks that it is seen).
"""

from __future__ import annotations

import gc
import socket

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from tiny import VOCAB, tiny_config  # noqa: E402
from torch.utils.data import default_collate as collate  # noqa: E402

from training.components.data import sft_sample as sample  # noqa: E402
from training.components.loss import IGNORE_INDEX  # noqa: E402
from training.models.decoder import CausalLMLoss, build_model, materialize  # noqa: E402

N = 32  # tokens per packed sequence (inputs); the sequence holds N + 1
DEPTH, WIDTH = 12, 256
TOL64 = DEPTH * WIDTH * torch.finfo(torch.float64).eps
TOL32 = DEPTH * WIDTH * torch.finfo(torch.float32).eps

# (tokens, loss mask): a prompt (mask 0) then an answer (mask 1); lengths 9, 6 and 11 fill 26 of 33
rng = np.random.default_rng(7)
EXAMPLES = [
    (rng.integers(1, VOCAB, length), np.array([0] * prompt + [1] * (length - prompt)))
    for length, prompt in ((9, 4), (6, 2), (11, 5))
]


def pack(examples, length: int = N + 1):
    """One packed sequence of ``length`` tokens: the examples, then padding as an example of its own."""
    tokens = np.concatenate([t for t, _ in examples])
    mask = np.concatenate([m for _, m in examples])
    positions = np.concatenate([np.arange(len(t)) for t, _ in examples])
    pad = length - len(tokens)
    assert pad >= 0
    return (np.concatenate([tokens, np.zeros(pad, np.int64)]), np.concatenate([mask, np.zeros(pad, np.int64)]),
            np.concatenate([positions, np.arange(pad)]))


def alone(example):
    """The example by itself, unpadded: positions 0 .. len - 1, so plain causal attention (no mask tensor)."""
    tokens, mask = example
    return sample(tokens, mask, np.arange(len(tokens)))


def only(batch, index):
    """The packed sample with the labels of example ``index`` only (the others -100)."""
    starts = np.cumsum([0] + [len(t) for t, _ in EXAMPLES])
    labels = torch.full_like(batch["labels"], IGNORE_INDEX)
    span = slice(int(starts[index]), int(starts[index + 1]) - 1)  # the labels predicted from inside the example
    labels[span] = batch["labels"][span]
    return {**batch, "labels": labels}


@pytest.fixture(scope="module")
def model():
    """The tiny Llama (GQA, RoPE) in float64."""
    lm = build_model(tiny_config().model)
    materialize(lm, torch.device("cpu"), seed=3)
    return CausalLMLoss(lm.double(), loss_chunk_tokens=24)


def loss_and_grads(model, batch):
    """The loss sum and its gradient, all in float64 (the trainer's loss upcasts to float32 only)."""
    b = collate([batch])
    logits = model.lm(b["input_ids"], b["position_ids"])
    loss = torch.nn.functional.cross_entropy(logits[0], b["labels"][0], ignore_index=IGNORE_INDEX, reduction="sum")
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params)
    return loss.detach(), torch.cat([g.reshape(-1) for g in grads])


def close(a, b, tol):
    scale = max(1.0, float(torch.linalg.vector_norm(b)))
    return float(torch.linalg.vector_norm(a - b)) <= tol * scale


def test_labels_follow_the_contract():
    """A target is valid where its mask is 1 and it does not start an example: prompts, padding and
    the first token of the next example are never learnt."""
    tokens, mask, positions = pack(EXAMPLES[:2])
    s = sample(tokens, mask, positions)
    assert s["input_ids"].tolist() == tokens[:-1].tolist() and s["position_ids"].tolist() == positions[:-1].tolist()
    valid = (s["labels"] != IGNORE_INDEX).numpy()
    expected = (mask[1:] == 1) & (positions[1:] != 0)
    assert valid.tolist() == expected.tolist()
    assert valid.sum() == (9 - 4) + (6 - 2)  # the answers' tokens
    assert s["labels"][8] == IGNORE_INDEX  # the second example's first token is not the first one's target
    assert s["labels"][valid].tolist() == tokens[1:][valid].tolist()
    # loss on every token (the mask all 1): still no target across the boundary, nor into the padding
    everything = [(t, np.ones_like(m)) for t, m in EXAMPLES[:2]]
    s = sample(*pack(everything))
    assert int((s["labels"] != IGNORE_INDEX).sum()) == (9 - 1) + (6 - 1)
    assert s["labels"][8] == IGNORE_INDEX and s["labels"][14] == IGNORE_INDEX


def test_packing_changes_neither_the_loss_nor_the_gradients_of_an_example(model):
    packed = sample(*pack(EXAMPLES))
    total_loss, total_grad = loss_and_grads(model, packed)
    alone_losses, alone_grads = zip(*(loss_and_grads(model, alone(e)) for e in EXAMPLES))
    for index in range(len(EXAMPLES)):
        loss, grad = loss_and_grads(model, only(packed, index))
        assert close(loss, alone_losses[index], TOL64), (index, float(loss), float(alone_losses[index]))
        assert close(grad, alone_grads[index], TOL64), index
    assert close(total_loss, sum(alone_losses), TOL64)
    assert close(total_grad, sum(alone_grads), TOL64)


def test_attention_does_not_cross_examples(model):
    """Other tokens in example A leave example B's logits in the pack unchanged; without the
    per-example positions (one causal sequence) they change them, so this test sees a leak."""
    (a_tokens, a_mask), b, c = EXAMPLES
    other_a = ((a_tokens * 5 + 11) % VOCAB, a_mask)
    span = slice(len(a_tokens), len(a_tokens) + len(b[0]))

    def logits(examples, positions: bool):
        s = collate([sample(*pack(examples))])
        with torch.no_grad():
            hidden = model.lm.model(s["input_ids"], s["position_ids"] if positions else None)
            return model.lm.lm_head(hidden)[0, span]

    first, second = logits([EXAMPLES[0], b, c], True), logits([other_a, b, c], True)
    assert close(first, second, TOL64)
    with torch.no_grad():  # and equal to B alone: RoPE restarts at B's first token
        by_itself = model.lm(torch.as_tensor(b[0])[None])[0]
    assert close(first, by_itself, TOL64)
    leaked = logits([EXAMPLES[0], b, c], False) - logits([other_a, b, c], False)
    assert float(leaked.abs().max()) > 1e-3


def write_packed(directory, shards: list[list[tuple]]) -> None:
    """Packed SFT shards as the contract has them: tokens, loss mask and positions, and shards.json."""
    import hashlib
    import json

    directory.mkdir(parents=True, exist_ok=True)
    entries = []
    for number, rows in enumerate(shards):
        name = f"shard-{number:05d}"
        np.stack([r[0] for r in rows]).astype(np.uint16).tofile(directory / f"{name}.bin")
        np.stack([r[1] for r in rows]).astype(np.uint8).tofile(directory / f"{name}.mask.bin")
        np.stack([r[2] for r in rows]).astype(np.uint16).tofile(directory / f"{name}.pos.bin")
        files = [f"{name}.bin", f"{name}.mask.bin", f"{name}.pos.bin"]
        sums = {file: hashlib.sha256((directory / file).read_bytes()).hexdigest() for file in files}
        entries.append({"file": f"{name}.bin", "sequences": len(rows), "max_token": VOCAB - 1, "sha256": sums})
    (directory / "shards.json").write_text(json.dumps({
        "kind": "sft-packed", "sequence_length": N, "token_dtype": "uint16", "fingerprint": "0" * 64,
        "loss_on": "assistant", "overlong": "drop", "shards": entries}))


def test_validation_reads_packed_shards_in_order(tmp_path):
    """The validation reader takes the contract's files: tokens, mask and positions per shard, and
    with ``holdout_every`` the sequences the training stream skips."""
    from training.components.data import sft_validation_batches

    rows = [pack(EXAMPLES[:2]), pack(EXAMPLES[2:]), pack(EXAMPLES[1:])]
    write_packed(tmp_path, [rows[:2], rows[2:]])
    second_rank = sft_validation_batches(tmp_path, "uint16", N, 1, rank=1, world_size=2, count=2)
    assert len(second_rank) == 1
    assert {k: v[0].tolist() for k, v in second_rank[0].items()} == {k: v.tolist() for k, v in sample(*rows[1]).items()}
    held_out = sft_validation_batches(tmp_path, "uint16", N, 1, rank=0, world_size=1, count=4, holdout_every=3)
    assert [b["input_ids"][0].tolist() for b in held_out] == [sample(*rows[2])["input_ids"].tolist()]


# -- through the trainer: one gloo rank, FSDP, float32 -------------------------------------


@pytest.fixture(scope="module")
def trainer():
    from training.trainer import build

    created = not dist.is_initialized()
    if created:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    cfg = tiny_config(model={"init_checkpoint": "s3://example-bucket/tiny/"}, sft={"adapter": "none"},
                      parallel={"sharding": "full", "shard_group_size": 1})
    yield build(cfg, None)
    if created:
        dist.destroy_process_group()
    gc.collect()  # free the groups here: a process forked later (a DataLoader worker) must not inherit them


def _step_gradient(trainer, batches) -> tuple[float, torch.Tensor]:
    from training.trainer import forward_backward, micro_batch

    trainer.optimizer.zero_grad(set_to_none=True)
    loss = forward_backward(trainer, [micro_batch(trainer, collate([b]), torch.device("cpu")) for b in batches])
    grads = [p.grad.full_tensor() for p in trainer.model.parameters() if p.grad is not None]
    trainer.optimizer.zero_grad(set_to_none=True)
    return float(loss), torch.cat([g.reshape(-1) for g in grads])


def test_an_sft_step_through_the_trainer_equals_the_examples_alone(trainer):
    """A packed micro-batch and the same examples as one micro-batch each give the step the same
    loss (the mean over valid labels) and gradient; pretraining-style windows would not."""
    packed_loss, packed_grad = _step_gradient(trainer, [sample(*pack(EXAMPLES))])
    alone_loss, alone_grad = _step_gradient(trainer, [alone(e) for e in EXAMPLES])
    valid = sum(int(m[1:].sum()) for _, m in EXAMPLES)
    assert valid == 5 + 4 + 6
    assert abs(packed_loss - alone_loss) <= TOL32 * max(1.0, alone_loss)
    assert close(packed_grad, alone_grad, TOL32)
    # without the per-example positions the examples see each other and the gradient moves
    leaky = {**sample(*pack(EXAMPLES)), "position_ids": torch.arange(N)}
    _, leaky_grad = _step_gradient(trainer, [leaky])
    assert not close(leaky_grad, alone_grad, 100 * TOL32)


def test_context_parallel_with_sft_is_refused():
    with pytest.raises(ValueError, match="context_parallel 2 with sft: ring attention .* no document mask"):
        tiny_config(model={"init_checkpoint": "s3://example-bucket/tiny/"}, sft={"adapter": "none"},
                    parallel={"sharding": "full", "shard_group_size": 2, "context_parallel": 2})


def test_sft_validation_is_the_mean_over_valid_labels(trainer, tmp_path, monkeypatch):
    """The validation loss of packed sequences is the loss of their examples run alone, summed and
    divided by the count of valid labels: masks as in training, each label weighing the same."""
    from tiered_training.contract.runconfig import ValidationConfig
    from training.components.validation import Validator

    # 2 micro-batches of 2 sequences, with 10 and 16 valid labels
    batches = [[EXAMPLES[:1], EXAMPLES[:1]], [EXAMPLES[2:], EXAMPLES[1:]]]
    write_packed(tmp_path, [[pack(examples) for batch in batches for examples in batch]])
    monkeypatch.setenv("TT_VALIDATION_DIR", str(tmp_path))
    cfg = trainer.cfg.model_copy(update={"validation": ValidationConfig(source="channel", batches=2)})
    assert cfg.batch.micro_batch_size == 2
    validator = Validator(cfg, tmp_path, trainer.model, torch.device("cpu"), rank=0, world_size=1)
    one = torch.ones((), dtype=torch.int64)
    sums, counts = np.zeros(len(batches)), np.zeros(len(batches))  # per micro-batch
    with torch.no_grad():
        for index, batch in enumerate(batches):
            for example in (e for examples in batch for e in examples):
                s = collate([alone(example)])
                sums[index] += float(trainer.model(s["input_ids"], s["labels"], None, divisor=one))
                counts[index] += int((s["labels"] != IGNORE_INDEX).sum())
    assert counts.tolist() == [10, 16]
    expected = sums.sum() / counts.sum()
    loss = validator.evaluate()
    assert abs(loss - expected) <= TOL32 * expected
    assert abs(np.mean(sums / counts) - expected) > 5 * TOL32 * expected  # the mean of batch means is not it


def test_an_sft_run_starts_from_the_checkpoint_with_masked_labels_and_records_the_data(trainer, tmp_path, monkeypatch):
    """``run`` with ``cfg.sft`` on data prepared by ``training.sft_data``: the first step's loss is the
    init checkpoint's loss on the first packed batch the reader gives, masks and per-example positions
    included (as transformers computes it); the checkpoints record the packed shards' fingerprint.
    Tolerance: the test_init_checkpoint_loss bound, 10 x 128 u."""
    import json
    import logging

    import torch.nn.functional as F
    from tiny import tiny_chat_jsonl, tiny_chat_tokenizer
    from transformers import LlamaForCausalLM

    from training import sft_data
    from training.components.data import build_sft_dataloader
    from training.models.random_checkpoint import write_random_checkpoint
    from training.paths import Paths
    from training.trainer import run

    logger = logging.getLogger("training")  # run() sets up its own logging: give it back to pytest after
    monkeypatch.setattr(logger, "handlers", list(logger.handlers))
    monkeypatch.setattr(logger, "propagate", logger.propagate)
    assert sft_data.main([str(tiny_chat_jsonl(tmp_path / "chat.jsonl", 24)), "--tokenizer", str(tiny_chat_tokenizer(
        tmp_path / "tok")), "--out", str(tmp_path / "prepared"), "--sequence-length", str(N), "--overlong", "drop"]) == 0
    data = tmp_path / "prepared" / "train"
    cfg = trainer.cfg.model_copy(update={
        "batch": trainer.cfg.batch.model_copy(update={"total_steps": 2, "global_batch_tokens": 64}),
        "run": trainer.cfg.run.model_copy(update={"id": "sft-run"})})
    write_random_checkpoint(cfg.model, tmp_path / "init", seed=7)
    paths = Paths(data, tmp_path / "checkpoints", tmp_path / "model", tmp_path / "init")
    level = logger.level
    try:
        result = run(cfg, paths, resume=False, export=False)
    finally:
        logger.setLevel(level)
    assert result.step == 2 and result.checkpoint_step == 2

    lm = LlamaForCausalLM.from_pretrained(tmp_path / "init", dtype=torch.float32).eval()
    first = next(iter(build_sft_dataloader(data, "uint16", N, 2, rank=0, world_size=1, seed=cfg.data.seed,
                                           vocab_size=VOCAB)))
    assert (first["labels"] != IGNORE_INDEX).any() and (first["labels"] == IGNORE_INDEX).any()
    with torch.no_grad():
        # use_cache=False: with a KV cache, transformers does not derive the document mask from the positions
        logits = lm(input_ids=first["input_ids"], position_ids=first["position_ids"], use_cache=False).logits
    expected = F.cross_entropy(logits.reshape(-1, VOCAB), first["labels"].reshape(-1), ignore_index=IGNORE_INDEX).item()
    assert result.losses[1] == pytest.approx(expected, rel=10 * 128 * 2.0**-24)
    manifest = json.loads((tmp_path / "checkpoints" / "step-2" / "COMMITTED").read_text())
    assert manifest["run"]["sft_data_fingerprint"] == json.loads((data / "shards.json").read_text())["fingerprint"]


def test_an_sft_run_refuses_packed_shards_of_another_token_type(trainer, tmp_path):
    """The RunConfig's ``data.token_dtype`` and the manifest's must agree: the reader says how to fix it."""
    from training.components.data import DataError
    from training.paths import Paths
    from training.trainer import build_train_dataloader

    write_packed(tmp_path, [[pack(EXAMPLES)] * 2])
    cfg = trainer.cfg.model_copy(update={"data": trainer.cfg.data.model_copy(update={"token_dtype": "uint32"})})
    with pytest.raises(DataError, match=r"token_dtype is uint16, but the run reads uint32 \(data.token_dtype\): set "
                                        r"data.token_dtype: uint16 in the recipe"):
        build_train_dataloader(cfg, Paths(tmp_path, tmp_path / "ck", tmp_path / "model"), trainer)
