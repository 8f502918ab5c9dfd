"""The evaluation of the export after the run's last step: what a reviewer reads before approving the model.

Rank 0 loads the exported folder as a server would (``transformers.AutoModelForCausalLM``; an adapter export on
its base with peft), then:

- scores it on held-out data (the validation pass's batches of rank 0): the mean loss over the valid labels and
  the perplexity ``exp(loss)``. Packed fine-tuning sequences are split into their examples at each position
  reset, so every example is scored alone, as the trainer's document mask has it. A task is scored by the entry
  of :data:`SCORERS` named after it; a task without one (DPO's preference accuracy lives with its trainer) records
  why it has no held-out score;
- answers the recipe's ``evaluation.prompts`` (greedy, at most ``max_new_tokens``), each rendered as a user turn by
  the export's chat template when it has one;
- records the run's final training metrics as the trainer reports them (any names: a DPO run's ``rewards/*``
  included), the run's identity and the data's checksums (the shard manifests' sha256s and their fingerprint).

The report is ``evaluation.json`` (``contract.container.EVALUATION_FILE``) with a ``sha256`` of its own canonical
body (:func:`checksum`; :func:`read_evaluation` checks it), written in the model directory (inside the job's
``model.tar.gz``) and at the top of the checkpoint directory, which SageMaker copies to the run's prefix where
the Register step's model package points. Each final metric is also printed as ``FINAL <name>=<value>``
(``contract.metrics.FINAL_METRIC_LINE``), which the last segment's MetricDefinitions parse for the package.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from tiered_training.contract import metrics as catalogue
from tiered_training.contract.evaluation import EVALUATION_FILE, checksum, verified
from tiered_training.contract.runconfig import RunConfig

log = logging.getLogger("training.evaluation")

FORMAT = 1
IGNORE_INDEX = -100


# -- the checksum ---------------------------------------------------------------------------


def write_evaluation(report: dict[str, Any], directories: Iterable[Path]) -> list[Path]:
    """``evaluation.json`` with its checksum in each directory; the paths written."""
    report = {**report, "sha256": checksum(report)}
    text = json.dumps(report, indent=2, sort_keys=True) + "\n"
    written = []
    for directory in directories:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / EVALUATION_FILE
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(text)
        temporary.replace(path)
        written.append(path)
    return written


def read_evaluation(path: Path) -> dict[str, Any]:
    """An ``evaluation.json``, its checksum checked (ValueError naming the file otherwise)."""
    return verified(Path(path).read_text(), str(path))


# -- held-out scores ------------------------------------------------------------------------


def _token_losses(model, input_ids: torch.Tensor, labels: torch.Tensor) -> tuple[float, int]:
    """Sum of the cross-entropy over the valid labels of one ``[1, n]`` sequence, and their count."""
    logits = model(input_ids=input_ids).logits.float()
    valid = labels != IGNORE_INDEX
    if not bool(valid.any()):
        return 0.0, 0
    loss = torch.nn.functional.cross_entropy(logits[valid], labels[valid], reduction="sum")
    return float(loss), int(valid.sum())


def _examples(positions: torch.Tensor) -> list[tuple[int, int]]:
    """The ``(start, end)`` spans of the packed examples in one row: a new one wherever the position does not go
    up by one (as ``training.models.attention.document_ids``)."""
    starts = [0] + [i for i in range(1, len(positions)) if int(positions[i]) != int(positions[i - 1]) + 1]
    return list(zip(starts, starts[1:] + [len(positions)]))


@torch.no_grad()
def score_loss(model, batches: list[Any], device: torch.device) -> dict[str, Any]:
    """Held-out loss and perplexity of a causal LM: windows of ``sequence_length + 1`` tokens (pretraining), or
    packed SFT dicts (``input_ids``, ``labels``, ``position_ids``), each example scored alone."""
    total, count, sequences = 0.0, 0, 0
    for batch in batches:
        if isinstance(batch, dict):
            for row in range(batch["input_ids"].shape[0]):
                ids, labels, positions = (batch[k][row] for k in ("input_ids", "labels", "position_ids"))
                for start, end in _examples(positions):
                    loss, n = _token_losses(
                        model, ids[None, start:end].to(device), labels[None, start:end].to(device)
                    )
                    total, count, sequences = total + loss, count + n, sequences + 1
        else:
            windows = batch.to(device)
            for row in windows:
                loss, n = _token_losses(model, row[None, :-1], row[None, 1:])
                total, count, sequences = total + loss, count + n, sequences + 1
    if count == 0:
        return {"skipped": "the held-out batches have no valid label"}
    mean = total / count
    return {
        catalogue.FINAL_EVAL_LOSS: mean,
        catalogue.FINAL_EVAL_PERPLEXITY: math.exp(min(mean, 700.0)),
        "tokens": count,
        "sequences": sequences,
    }


# The held-out score of each task: pretraining and SFT by loss and perplexity. A task that scores otherwise (DPO:
# preference accuracy on held-out pairs) adds its scorer here, and the names it returns to
# contract.metrics.TASK_FINAL_METRICS so that the Register step records them.
SCORERS: dict[str, Callable[[Any, list[Any], torch.device], dict[str, Any]]] = {
    "pretrain": score_loss,
    "sft": score_loss,
}


# -- generation -----------------------------------------------------------------------------


@torch.no_grad()
def generate_answers(model, tokenizer, prompts: list[str], max_new_tokens: int, device: torch.device) -> list[dict]:
    """Greedy answers of the export to ``prompts``, each as a user turn of its chat template when it has one."""
    answers = []
    for prompt in prompts:
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt"
            )
            if not isinstance(ids, torch.Tensor):  # newer transformers return a BatchEncoding
                ids = ids["input_ids"]
        else:
            ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        ids = ids.to(device)
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        )
        new = out[0, ids.shape[1] :]
        answers.append(
            {"prompt": prompt, "answer": tokenizer.decode(new, skip_special_tokens=True), "tokens": int(new.numel())}
        )
    return answers


# -- the export ------------------------------------------------------------------------------


def load_export(cfg: RunConfig, model_dir: Path, init_dir: Path | None, device: torch.device):
    """The export as a server loads it: merged weights, or the adapter on its base (``init_dir``) with peft."""
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if cfg.export.format == "adapter":
        from peft import PeftModel

        if init_dir is None:
            raise FileNotFoundError("an adapter export needs its base, the starting checkpoint, which is not here")
        base = AutoModelForCausalLM.from_pretrained(init_dir, dtype=dtype)
        model: Any = PeftModel.from_pretrained(base, model_dir)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    return model.to(device).eval()


def load_tokenizer(model_dir: Path, init_dir: Path | None):
    """The export's tokenizer (its own files, else the starting checkpoint's); None when neither has one."""
    from transformers import AutoTokenizer

    for directory in (model_dir, init_dir):
        names = ("tokenizer.json", "tokenizer.model")
        if directory is not None and any((Path(directory) / n).is_file() for n in names):
            return AutoTokenizer.from_pretrained(directory)
    return None


def evaluate_export(
    cfg: RunConfig,
    model_dir: Path,
    *,
    held_out: list[Any] | None,
    final: dict[str, float],
    data: dict[str, Any],
    init_dir: Path | None = None,
    device: torch.device | None = None,
) -> dict[str, Any]:
    """The evaluation report of the export in ``model_dir`` (see the module docstring); never raises for what the
    evaluation cannot do, it records why instead (the run itself succeeded)."""
    import transformers

    device = device or torch.device("cpu")
    started = time.perf_counter()
    task = "pretrain" if cfg.sft is None else "sft"
    task = str(getattr(cfg, "task", task))  # a RunConfig that names its task (DPO) overrides the inference
    report: dict[str, Any] = {
        "format": FORMAT,
        "recipe": cfg.recipe_name,
        "task": task,
        "plan_hash": cfg.plan_hash(),
        "run_id": cfg.run.id,
        "export": {"format": cfg.export.format, "dtype": cfg.export.dtype},
        "training": {k: v for k, v in final.items() if v is not None and math.isfinite(v)},
        "data": data,
        "libraries": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    try:
        model = load_export(cfg, model_dir, init_dir, device)
    except Exception as error:  # a folder transformers cannot load: what a reviewer must know first
        report["error"] = f"the export in {model_dir} does not load in transformers: {error}"
        return report
    scorer = SCORERS.get(task)
    try:
        if scorer is None:
            report["held_out"] = {"skipped": f"no held-out scorer for task {task} (training.evaluation.SCORERS)"}
        elif not held_out:
            report["held_out"] = {"skipped": "the run has no held-out data (data.validation_uri or a validation share)"}
        else:
            report["held_out"] = scorer(model, held_out, device)
        prompts = list(cfg.evaluation.prompts)
        if prompts:
            tokenizer = load_tokenizer(model_dir, init_dir)
            if tokenizer is None:
                report["generations"] = {"skipped": "neither the export nor its starting checkpoint has a tokenizer"}
            else:
                report["generations"] = generate_answers(
                    model, tokenizer, prompts, cfg.evaluation.max_new_tokens, device
                )
    except Exception as error:  # recorded: without its held-out scores the Register step refuses the package
        report["error"] = f"the evaluation of {model_dir} failed: {type(error).__name__}: {error}"
    report["seconds"] = round(time.perf_counter() - started, 2)
    return report


def final_metrics(report: dict[str, Any]) -> dict[str, float]:
    """The report's final metrics: every training metric the trainer reported, and the held-out scores."""
    found: dict[str, float] = {
        name: float(value)
        for name, value in (report.get("training") or {}).items()
        if isinstance(value, (int, float)) and math.isfinite(value) and re.fullmatch(r"[\w:/.\-]+", name)
    }
    for name, value in (report.get("held_out") or {}).items():
        if ":" in name and isinstance(value, (int, float)) and math.isfinite(value):
            found[name] = float(value)
    return found


def print_final_metrics(report: dict[str, Any], say: Callable[[str], None] = print) -> None:
    """One ``FINAL <name>=<value>`` line per final metric, for the last segment's MetricDefinitions."""
    for name, value in final_metrics(report).items():
        say(catalogue.FINAL_METRIC_LINE.format(name=name, value=value))
