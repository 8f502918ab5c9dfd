"""Preference tuning against trl's ``DPOTrainer`` (and trl + peft for LoRA), the oracle.

The same records go through trl's tokenisation and collator and through ``training.dpo_data`` (packed
shards, read back by the trainer's ``SftSequences``); the same tiny random Llama weights are loaded into
transformers (for trl) and into the trainer's decoder. Per pair, the completion log-probabilities, the
loss, the rewards and every gradient must equal trl's, for each loss type, full and LoRA.

Tolerances, derived: everything runs in fp32 on the CPU, and the two sides compute the same operations
(the decoder follows transformers op for op) in a different order (our chunked log-softmax against trl's
fused head; packed rows with a document mask against padded rows). Each logit then differs by a few units
of fp32 rounding (u = 2^-24 ~ 6e-8) times its magnitude and the depth of the sums that make it (hidden 64,
2 layers): below 1e-6. A token's log-probability (a log-sum-exp over 256 logits of magnitude ~1) differs by
at most ~2e-6, and a completion's sum over at most 12 tokens by at most ~3e-5: LOGP_ATOL. The losses and
rewards are 1-Lipschitz in beta x the margin (sigmoid, robust) or in the per-token margin with slope
2 |delta - 1/(2 beta)| <= 2 x 5 / (2 x 0.1) = 50 (IPO, |delta| << 5): their tolerance is LOGP_ATOL x beta x 2
and LOGP_ATOL x 50. Gradients: the same relative error as the logits they come from, 1e-4 relative with an
absolute floor of 1e-6 for the entries near zero.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
pytest.importorskip("peft")

from tiny import hf_model, tiny_config  # noqa: E402

from tiered_training.contract.runconfig import DpoConfig, LoraConfig  # noqa: E402
from training.components.data import SftSequences  # noqa: E402
from training.dpo_data import encode_pair, prepare, to_pair  # noqa: E402
from training.dpo_loss import PairLogps, Pairs, pair_step, reference_pairs, sequence_index  # noqa: E402
from training.models.decoder import build_model, materialize  # noqa: E402
from training.models.lora import PEFT_PREFIX, adapters_disabled, apply_lora  # noqa: E402
from training.sft_data import Settings, SftTokenizer  # noqa: E402
from training.tools.tiny_chat import tiny_chat_tokenizer  # noqa: E402

os.environ.setdefault("TQDM_DISABLE", "1")
LOGP_ATOL = 3e-5
BETA = 0.1
LOSSES = [("sigmoid", 0.0), ("ipo", 0.0), ("robust", 0.1)]
LORA = LoraConfig(rank=4, alpha=8.0, dropout=0.0)

RECORDS = [
    # explicit prompt, strings (trl appends EOS to the answers)
    {"prompt": "red green", "chosen": " green red", "rejected": " red"},
    {"prompt": "cat dog blue", "chosen": " blue dog cat", "rejected": " cat cat cat cat"},
    # explicit prompt, conversations
    {
        "prompt": [{"role": "user", "content": "red green"}],
        "chosen": [{"role": "assistant", "content": "green red"}],
        "rejected": [{"role": "assistant", "content": "red green"}],
    },
    {
        "prompt": [{"role": "system", "content": "you reverse words"}, {"role": "user", "content": "dog cat"}],
        "chosen": [{"role": "assistant", "content": "cat dog"}],
        "rejected": [{"role": "assistant", "content": "dog"}],
    },
    # implicit prompt: the shared beginning of the answers
    {
        "chosen": [{"role": "user", "content": "blue pink"}, {"role": "assistant", "content": "pink blue"}],
        "rejected": [{"role": "user", "content": "blue pink"}, {"role": "assistant", "content": "blue"}],
    },
    {"chosen": "white black gray", "rejected": "white black white"},
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    return tiny_chat_tokenizer(tmp_path_factory.mktemp("dpo-tok") / "tok")


@pytest.fixture(scope="module")
def rows(tokenizer_dir, tmp_path_factory):
    """The records prepared by training.dpo_data and read back as the trainer reads them: one micro-batch."""
    work = tmp_path_factory.mktemp("dpo-data")
    data = work / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    prepare([data], SftTokenizer(tokenizer_dir), work / "out", Settings(sequence_length=40, format="preference"))
    stream = SftSequences(work / "out" / "train", None, 40, rank=0, world_size=1, seed=0)
    samples = [stream._read(i) for i in range(int(stream.starts[-1]))]
    return {key: torch.stack([s[key] for s in samples]) for key in ("input_ids", "labels", "position_ids")}


def _hf_tokenizer(path: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    tok.pad_token = tok.pad_token or tok.eos_token
    return tok


def _trl(tokenizer_dir: Path, tmp_path: Path, loss: str, smoothing: float, *, lora: bool):
    """trl's trainer over RECORDS (full: a reference model of other weights; LoRA: peft, adapters disabled)."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    torch.manual_seed(0)
    policy, ref = hf_model(tiny_config().model), hf_model(tiny_config().model)
    args = DPOConfig(
        output_dir=str(tmp_path / "trl"), beta=BETA, loss_type=[loss], label_smoothing=smoothing, report_to=[],
        use_cpu=True, per_device_train_batch_size=len(RECORDS), bf16=False, dataloader_num_workers=0,
    )
    options: dict = {"ref_model": ref}
    if lora:
        import peft

        options = {"peft_config": peft.LoraConfig(r=LORA.rank, lora_alpha=LORA.alpha, lora_dropout=0.0,
                                                  target_modules=list(LORA.target_modules))}
    trainer = DPOTrainer(model=policy, args=args, train_dataset=Dataset.from_list(_group((True, True))),
                         processing_class=_hf_tokenizer(tokenizer_dir), **options)
    if lora:  # B = 0 would make the policy its reference: give the adapters weights
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, param in trainer.model.named_parameters():
                if ".lora_B." in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    return trainer, ref


def _kind(record: dict) -> tuple[bool, bool]:
    """A dataset's column holds one form: conversations or strings, with or without a prompt."""
    return isinstance(record["chosen"], list), "prompt" in record


def _group(kind: tuple[bool, bool]) -> list[dict]:
    return [r for r in RECORDS if _kind(r) == kind]


def _trl_rows(trainer) -> list[dict]:
    """trl's tokenised rows of RECORDS, in their order (a datasets column holds strings or conversations, not both,
    and with or without a prompt: each form goes through the trainer's own _prepare_dataset apart)."""
    from datasets import Dataset

    groups = {
        kind: iter(
            trainer._prepare_dataset(Dataset.from_list(_group(kind)), trainer.processing_class, trainer.args, "more")
        )
        for kind in dict.fromkeys(map(_kind, RECORDS))
    }
    keys = ("prompt_ids", "chosen_ids", "rejected_ids")
    return [{k: v for k, v in next(groups[_kind(r)]).items() if k in keys} for r in RECORDS]


def _ours(trainer, ref, *, lora: bool):
    """The trainer's decoder with trl's policy weights (and its reference's, for the precomputed pass)."""
    def plain(hf_state):
        lm = build_model(tiny_config().model)
        if lora:
            apply_lora(lm, LORA)
        materialize(lm, torch.device("cpu"), seed=0)
        lm.load_state_dict(hf_state, strict=True)
        return lm

    if lora:
        state = {k.removeprefix(PEFT_PREFIX): v for k, v in trainer.model.state_dict().items()}
        return plain(state), None
    return plain(trainer.model.state_dict()), plain(ref.state_dict())


def _order(rows, pairs: Pairs, trl_rows: list[dict]) -> list[int]:
    """The record of each of our pairs, matched by its chosen sequence's tokens."""
    sequences = sequence_index(rows["position_ids"])
    found = []
    for row, slot in zip(pairs.rows.tolist(), pairs.slots.tolist()):
        tokens = rows["input_ids"][row][sequences[row] == 2 * slot].tolist()
        matches = [i for i, r in enumerate(trl_rows) if r["prompt_ids"] + r["chosen_ids"][:-1] == tokens[:-1]]
        assert len(matches) == 1, tokens
        found.append(matches[0])
    return found


def test_the_tokens_and_masks_equal_trls(tokenizer_dir, tmp_path):
    trainer, _ = _trl(tokenizer_dir, tmp_path, "sigmoid", 0.0, lora=False)
    tok = SftTokenizer(tokenizer_dir)
    for i, (record, expected) in enumerate(zip(RECORDS, _trl_rows(trainer))):
        prompt, chosen, rejected = encode_pair(tok, to_pair(record, f"record {i}"))
        assert (prompt, chosen, rejected) == (
            expected["prompt_ids"], expected["chosen_ids"], expected["rejected_ids"]
        ), record


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("loss,smoothing", LOSSES, ids=[name for name, _ in LOSSES])
def test_logps_losses_rewards_and_gradients_equal_trls(tokenizer_dir, rows, tmp_path, loss, smoothing, lora):
    trainer, ref = _trl(tokenizer_dir, tmp_path, loss, smoothing, lora=lora)
    trl_rows = _trl_rows(trainer)
    batch = trainer.data_collator(trl_rows)
    # trl's per-pair log-probabilities: compute_ref_log_probs of a model (with a ref_model set, the adapters
    # stay on); under peft without ref_model, trl's own reference (the adapters disabled)
    trainer.ref_model, kept = trainer.model, trainer.ref_model
    trl_chosen, trl_rejected = trainer.compute_ref_log_probs(trainer.model, batch)
    trainer.ref_model = kept
    trl_ref_chosen, trl_ref_rejected = trainer.compute_ref_log_probs(trainer.model if lora else ref, batch)
    trl_loss = trainer.compute_loss(trainer.model, batch)
    trl_loss.backward()
    metrics = {name: values[-1] for name, values in trainer._metrics["train"].items()}

    lm, ref_lm = _ours(trainer, ref, lora=lora)
    cfg = DpoConfig(loss=loss, beta=BETA, label_smoothing=smoothing,
                    reference="adapter_disabled" if lora else "precomputed")
    model = PairLogps(lm, loss_chunk_tokens=24)
    inputs = (rows["input_ids"], rows["labels"], rows["position_ids"])
    if lora:
        with adapters_disabled(lm):
            reference = reference_pairs(model, *inputs)
    else:
        reference = reference_pairs(PairLogps(ref_lm, 24), *inputs)
    loss_value, sums, count = pair_step(model, cfg, *inputs, (reference.chosen, reference.rejected), len(RECORDS))
    loss_value.backward()
    assert count == len(RECORDS)

    ours = Pairs(*model(*inputs))
    order = _order(rows, ours, trl_rows)
    assert sorted(order) == list(range(len(RECORDS)))
    pick = torch.tensor(order)
    close = dict(atol=LOGP_ATOL, rtol=0)
    torch.testing.assert_close(ours.chosen.detach(), trl_chosen[pick], **close)
    torch.testing.assert_close(ours.rejected.detach(), trl_rejected[pick], **close)
    torch.testing.assert_close(reference.chosen, trl_ref_chosen[pick], **close)
    torch.testing.assert_close(reference.rejected, trl_ref_rejected[pick], **close)
    loss_atol = LOGP_ATOL * (50 if loss == "ipo" else 2 * BETA)
    torch.testing.assert_close(loss_value.detach(), trl_loss.detach(), atol=loss_atol, rtol=0)
    means = dict(zip(
        ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
         "logps/rejected"), (sums / count).tolist(),
    ))
    for name, value in means.items():
        atol = LOGP_ATOL * (1 if name.startswith("logps") else BETA * 2)
        assert value == pytest.approx(metrics[name], abs=atol), name
    assert metrics["rewards/margins"] != 0  # the reference differs from the policy: the oracle tests something

    theirs = {name.removeprefix(PEFT_PREFIX): p.grad for name, p in trainer.model.named_parameters()
              if p.grad is not None}
    mine = {name: p.grad for name, p in lm.named_parameters() if p.grad is not None}
    assert theirs.keys() == mine.keys() and mine
    for name, grad in mine.items():
        torch.testing.assert_close(grad, theirs[name], rtol=1e-4, atol=1e-6, msg=name)
