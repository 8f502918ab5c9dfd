"""The tool-calling SFT template (recipes/llama3.1-8b-tools-sft.yaml) rehearses on 2 hosts from raw JSON Lines in
S3: its pipeline's Prepare step packs the examples (messages with tools and tool calls) with the init checkpoint's
tokenizer, the training steps read the shards the step names in its property file, and the merged export loads in
transformers' text-generation pipeline and generates. A second execution on unchanged data reuses the shards. Each run
is registered with the prepared data's content key, and its evaluation answers the prompts the recipe lists."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("moto")
pytest.importorskip("datasets")

from tiered_training.rehearse.run import Options, Then, rehearse  # noqa: E402

pytestmark = pytest.mark.torch

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "recipes" / "llama3.1-8b-tools-sft.yaml"
PROMPTS = ["Say hello.", "What is two plus two?"]


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("prepare-rehearsal")
    recipe = workdir / TEMPLATE.name  # the template, with prompts for the evaluation
    recipe.write_text(
        TEMPLATE.read_text() + "evaluation:\n  prompts:\n" + "".join(f"    - {p}\n" for p in PROMPTS)
        + "  max_new_tokens: 6\n"
    )
    out = io.StringIO()
    result = rehearse(
        Options(recipe, hosts=2, workers=1, steps=3, params={"SkipProbe": "true"}, workdir=workdir, then=[Then({})]),
        out,
    )
    return result, out.getvalue(), workdir


def test_the_template_prepares_raw_examples_then_trains_and_a_rerun_reuses_them(rehearsal):
    result, log, workdir = rehearsal
    assert result.ok, log[-6000:]
    first, second = result.executions
    assert list(first.jobs) == ["Prepare", "TrainWithoutProbe"] and list(second.jobs) == list(first.jobs)
    made = re.search(r"preparing data ([0-9a-f]{32})", log)
    assert made, log[-6000:]
    key = made.group(1)
    assert log.count(f"preparing data {key}") == 1 and log.count(f"reusing prepared data {key}") == 1
    assert log.index(f"preparing data {key}") < log.index(f"reusing prepared data {key}")
    prepared = f"s3://rehearsal-checkpoint-store/llama31-8b-tools-sft/output/prepared/{key}/train/"
    assert first.property_files["Prepare"]["PreparedData"] == {"key": key, "uri": prepared, "reused": False}
    assert second.property_files["Prepare"]["PreparedData"] == {"key": key, "uri": prepared, "reused": True}
    # Both runs trained on those shards: the train channel each host got is the packed data of that key.
    for execution in (first, second):
        job = next(workdir.glob(f"pipelines-{execution.execution_id}-*-TrainWithoutProbe"))
        channel = job / "attempt-1" / "algo-2" / "opt/ml/input/data/train"
        manifest = json.loads((channel / "shards.json").read_text())
        assert manifest["kind"] == "sft-packed" and manifest["format"] == "messages" and manifest["examples"] > 0
        hp = json.loads((job / "attempt-1" / "algo-1" / "opt/ml/input/config/hyperparameters.json").read_text())
        assert json.loads(hp["run.data_uri"]) == prepared
    assert sorted(result.losses(execution=first)) == [1, 2, 3]


def test_the_merged_export_loads_in_transformers_and_generates(rehearsal):
    from transformers import pipeline

    result, log, _ = rehearsal
    exported = result.exported_of(result.executions[0])
    assert {"config.json", "generation_config.json", "tokenizer.json", "chat_template.jinja"} <= set(exported["files"])
    generate = pipeline("text-generation", model=exported["dir"], device="cpu")
    conversation = [{"role": "user", "content": "please reverse red cat"}]
    out = generate(conversation, max_new_tokens=4, do_sample=False)
    reply = out[0]["generated_text"][-1]
    assert reply["role"] == "assistant" and isinstance(reply["content"], str)
    prompt = generate.tokenizer.apply_chat_template(conversation, add_generation_prompt=True, return_tensors="pt")
    ids = generate.model.generate(**prompt, max_new_tokens=4, do_sample=False)
    assert ids.shape[1] > prompt["input_ids"].shape[1]  # new tokens after the prompt


def test_rehearse_data_packs_the_users_own_examples_with_the_recipes_chat_template(tmp_path, monkeypatch):
    """``--data``: a team's own OpenAI-shaped tool-calling file, prepared with Llama 3.1's chat template (a tiny
    byte-level tokenizer carrying it, given as --tokenizer), trains end to end; a recipe whose hub tokenizer is
    not cached is refused before anything runs, with how to give it."""
    import sys

    sys.path.insert(0, str(REPO / "tests" / "trainer"))
    from chat_families import conversations, family_tokenizer

    from tiered_training.rehearse.errors import RehearsalError

    data = tmp_path / "mine" / "tools.jsonl"
    data.parent.mkdir()
    records = [case["record"] for case in conversations("llama3.1").values()] * 4
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(RehearsalError, match="meta-llama/Llama-3.1-8B-Instruct .model.hf_id. is not in the local "
                                              "Hugging Face cache.*--tokenizer DIR"):
        rehearse(Options(TEMPLATE, hosts=1, workers=1, steps=2, data=data.parent, workdir=tmp_path / "no"), io.StringIO())
    tokenizer = family_tokenizer(tmp_path / "llama", "llama3.1", marked=False)
    out = io.StringIO()
    result = rehearse(Options(TEMPLATE, hosts=1, workers=1, steps=2, params={"SkipProbe": "true"}, data=data.parent,
                              tokenizer=tokenizer, workdir=tmp_path / "run"), out)
    log = out.getvalue()
    assert result.ok, log[-6000:]
    assert f"data: your raw examples, 1 file(s) of {data.stat().st_size:,} bytes from {data.parent}" in log
    (execution,) = result.executions
    job = next((tmp_path / "run").glob(f"pipelines-{execution.execution_id}-*-TrainWithoutProbe"))
    manifest = json.loads((job / "attempt-1" / "algo-1" / "opt/ml/input/data/train" / "shards.json").read_text())
    assert manifest["examples"] == len(records) and manifest["format"] == "messages"  # none dropped: 1,024-token windows
    assert manifest["vocab_size"] == 400  # the given tokenizer's, not the built-in one's
    assert sorted(result.losses(execution=execution)) == [1, 2]


def test_each_run_is_registered_with_the_prepared_datas_key_and_answers_the_prompts(rehearsal):
    result, log, _ = rehearsal
    key = re.search(r"preparing data ([0-9a-f]{32})", log).group(1)
    assert [p["metadata"]["data_key"] for p in result.packages] == [key, key], log[-3000:]
    last = result.packages[-1]["evaluation"]
    assert [g["prompt"] for g in last["generations"]] == PROMPTS, last.get("generations")
    assert all(0 < g["tokens"] <= 6 for g in last["generations"])
    assert "prompt 'Say hello.' -> " in log
