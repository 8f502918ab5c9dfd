"""The evaluation of the export (training/evaluation.py), against transformers' own loss, on a tiny saved model."""

from __future__ import annotations

import json
import math

import pytest
import torch
from tiny import hf_model, tiny_chat_tokenizer, tiny_config

from tiered_training.contract import metrics
from training import evaluation as ev


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """A tiny Llama saved as an export, with a chat tokenizer beside it."""
    torch.manual_seed(0)
    cfg = tiny_config(evaluation={"prompts": ["hello there", "how are you"], "max_new_tokens": 5})
    directory = tmp_path_factory.mktemp("export")
    hf_model(cfg.model).save_pretrained(directory)
    tokenizer = tiny_chat_tokenizer(directory / "tokenizer")
    for item in tokenizer.iterdir():
        item.rename(directory / item.name)
    return cfg, directory


def test_held_out_loss_and_perplexity_are_transformers_own(export):
    cfg, directory = export
    model = ev.load_export(cfg, directory, None, torch.device("cpu"))
    windows = torch.randint(0, cfg.model.vocab_size, (2, 2, 17))  # two batches of two windows of 16 + 1 tokens
    scored = ev.score_loss(model, list(windows), torch.device("cpu"))
    with torch.no_grad():  # transformers shifts the labels itself; every window has the same count of labels
        oracle = sum(float(model(input_ids=w[None], labels=w[None]).loss) for w in windows.reshape(4, 17)) / 4
    assert scored[metrics.FINAL_EVAL_LOSS] == pytest.approx(oracle, rel=1e-5)
    assert scored[metrics.FINAL_EVAL_PERPLEXITY] == pytest.approx(math.exp(oracle), rel=1e-5)
    assert scored["tokens"] == 4 * 16


def test_packed_examples_are_scored_alone(export):
    """A packed row of two examples: each is scored as if it ran alone (the trainer's document mask)."""
    cfg, directory = export
    model = ev.load_export(cfg, directory, None, torch.device("cpu"))
    ids = torch.randint(0, cfg.model.vocab_size, (12,))
    positions = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6])
    labels = torch.full((12,), -100)
    labels[2:4], labels[7:11] = ids[3:5], ids[8:12]  # labels[t] is the target of token t
    scored = ev.score_loss(model, [{"input_ids": ids[None], "labels": labels[None], "position_ids": positions[None]}],
                           torch.device("cpu"))
    total, count = 0.0, 0
    with torch.no_grad():
        for start, end in ((0, 5), (5, 12)):
            hf_labels = torch.cat([torch.tensor([-100]), labels[start:end - 1]])  # transformers shifts by one
            n = int((hf_labels != -100).sum())
            total += float(model(input_ids=ids[None, start:end], labels=hf_labels[None]).loss) * n
            count += n
    assert scored["sequences"] == 2 and scored["tokens"] == count == 6
    assert scored[metrics.FINAL_EVAL_LOSS] == pytest.approx(total / count, rel=1e-5)


def test_report_answers_prompts_and_carries_its_checksum(export, tmp_path, capsys):
    cfg, directory = export
    windows = [torch.randint(0, cfg.model.vocab_size, (2, 17))]
    final = {"train:loss": 2.5, "rewards/accuracies": 0.75, "validation:loss": float("nan")}
    report = ev.evaluate_export(cfg, directory, held_out=windows, final=final, data={"fingerprint": "abc"})
    assert report["training"] == {"train:loss": 2.5, "rewards/accuracies": 0.75}  # any name; no NaN
    assert [g["prompt"] for g in report["generations"]] == ["hello there", "how are you"]
    assert all(0 < g["tokens"] <= 5 for g in report["generations"])
    (path,) = ev.write_evaluation(report, [tmp_path])
    assert ev.read_evaluation(path)["held_out"] == report["held_out"]
    ev.print_final_metrics(report)
    lines = capsys.readouterr().out.splitlines()
    import re

    names = ("train:loss", "rewards/accuracies", "eval:loss", "eval:perplexity")
    found = {name: float(m.group(1)) for line in lines for name in names
             if (m := re.search(metrics.final_metric_regex(name), line))}
    assert set(found) == set(names) and found["rewards/accuracies"] == 0.75  # a task's own metric, by its name
    assert found["eval:loss"] == pytest.approx(report["held_out"]["eval:loss"], rel=1e-5)
    changed = json.loads(path.read_text())
    changed["training"]["train:loss"] = 0.1
    path.write_text(json.dumps(changed))
    with pytest.raises(ValueError, match="checksum does not match"):
        ev.read_evaluation(path)


def test_an_export_that_does_not_load_is_reported(tmp_path):
    cfg = tiny_config()
    report = ev.evaluate_export(cfg, tmp_path, held_out=None, final={"train:loss": 1.0}, data={})
    assert "does not load in transformers" in report["error"] and "held_out" not in report
