"""The LoRA fine-tuning template (recipes/qwen2.5-32b-lora.yaml) rehearses on 2 hosts: packed chat
shards made by the trainer's own data step, a random init checkpoint in the model channel, a
SIGTERM after step 1 and a resume,
then the same recipe exporting merged weights as a new run. The resumed run's losses equal the
uninterrupted run's bit for bit; the adapter loads with peft onto the init checkpoint, and its
merge equals the merged export. Each run ends registered in the recipe's model package group (moto's
SageMaker), with its final metrics and the held-out evaluation of its export (the adapter's on its base)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("moto")
pytest.importorskip("peft")

from tiered_training.rehearse.run import Options, Then, rehearse  # noqa: E402

pytestmark = pytest.mark.torch

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "recipes" / "qwen2.5-32b-lora.yaml"
STEPS = 3


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("sft-rehearsal")
    text = TEMPLATE.read_text()
    assert "export:\n  format: adapter\n" in text
    merged = workdir / "qwen2.5-32b-lora-merged.yaml"
    merged.write_text(text.replace("export:\n  format: adapter\n", "export:\n  format: merged\n"))
    out = io.StringIO()
    result = rehearse(Options(TEMPLATE, hosts=2, workers=1, steps=STEPS, params={"SkipProbe": "true"},
                              interrupt="sigterm@1", workdir=workdir, then=[Then({}, recipe=merged)]), out)
    return result, out.getvalue(), workdir


def test_the_lora_template_resumes_bit_identically_on_two_hosts(rehearsal):
    result, log, _ = rehearsal
    assert result.ok, log[-6000:]
    assert "chat examples packed into" in log and "init checkpoint: a random Hugging Face checkpoint" in log
    interrupted, fresh = result.executions
    assert [a.status for a in result.train_attempts(interrupted)] == ["Interrupted", "Completed"], log[-6000:]
    assert [a.status for a in result.train_attempts(fresh)] == ["Completed"]
    lines = [line for a in result.train_attempts(interrupted) for _, _, line in a.log]
    assert any("loading initial weights from" in line for line in lines)
    losses = result.losses(execution=interrupted)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert losses == result.losses(execution=fresh)  # bit for bit: the EMF JSON keeps every digit


def test_both_exports_load_and_agree(rehearsal):
    """The adapter (peft's format) on the init checkpoint, merged by peft, equals the merged export to
    one bf16 rounding (the export's dtype): |a - b| <= eps_bf16 * max(|a|, |b|)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    result, log, workdir = rehearsal
    interrupted, fresh = result.executions
    adapter, merged = result.exported_of(interrupted), result.exported_of(fresh)
    assert set(adapter["files"]) >= {"adapter_config.json", "adapter_model.safetensors"}, log[-3000:]
    assert any(".lora_A." in name for name in adapter["tensors"])
    assert not any("lora" in name for name in merged["tensors"]) and "model.embed_tokens.weight" in merged["tensors"]
    init = sorted(workdir.glob("*/attempt-1/algo-1/opt/ml/input/data/model"))[0]  # the model channel, as a host got it
    base = AutoModelForCausalLM.from_pretrained(init, dtype=torch.float32)
    adapted = PeftModel.from_pretrained(base, adapter["dir"]).merge_and_unload()
    exported = AutoModelForCausalLM.from_pretrained(merged["dir"], dtype=torch.float32)
    ours, theirs = adapted.state_dict(), exported.state_dict()
    assert ours.keys() == theirs.keys()
    eps = torch.finfo(torch.bfloat16).eps
    for name, tensor in theirs.items():
        ref = ours[name].to(torch.bfloat16).float()
        assert ((tensor - ref).abs() <= eps * torch.maximum(tensor.abs(), ref.abs())).all(), name
    from safetensors.torch import load_file

    trained = load_file(Path(adapter["dir"]) / "adapter_model.safetensors")
    assert any(t.abs().max() > 0 for n, t in trained.items() if ".lora_B." in n)  # peft starts B at zero: it trained


def test_sft_data_for_the_rehearsal_is_packed_by_the_trainers_data_step(tmp_path):
    """The shards under the data URI are what ``training.sft_data`` writes, with the recipe's settings;
    another seed gives other examples (a later execution on other data)."""
    import json

    from tiered_training.rehearse.data import put_sft_shards
    from tiered_training.rehearse.run import repo_root
    from tiered_training.rehearse.s3 import LocalS3, list_keys

    with LocalS3() as s3:
        client = s3.client()
        s3.ensure_bucket(client, "data")
        manifests = [put_sft_shards(client, f"s3://data/sft-{seed}/", sequence_length=32, token_dtype="uint32",
                                    loss_on="assistant", overlong="truncate", workdir=tmp_path, repo=repo_root(), seed=seed)
                     for seed in (0, 1)]
        keys = list_keys(client, "s3://data/sft-0/")
    first, other = manifests
    assert first["kind"] == "sft-packed" and first["sequence_length"] == 32 and first["token_dtype"] == "uint32"
    assert first["loss_on"] == "assistant" and first["overlong"] == "truncate" and first["truncated"] > 0
    assert {k.rsplit("/", 1)[-1] for k in keys} == {"shards.json", "shard-00000.bin", "shard-00000.mask.bin",
                                                    "shard-00000.pos.bin"}
    assert json.loads((tmp_path / "sft-data-0" / "prepared" / "train" / "shards.json").read_text()) == first
    assert other["fingerprint"] != first["fingerprint"]


def test_each_run_is_registered_with_its_metrics_and_evaluation(rehearsal):
    result, log, _ = rehearsal
    interrupted, fresh = result.executions
    adapter, merged = result.packages
    assert (adapter["version"], merged["version"]) == (1, 2), log[-3000:]
    assert adapter["group"] == merged["group"] and {adapter["approval"], merged["approval"]} == {"PendingManualApproval"}
    assert adapter["metadata"]["run_id"] == interrupted.execution_id and merged["metadata"]["run_id"] == fresh.execution_id
    # the final training loss the package records is the run's last step's
    assert float(merged["metadata"]["train:loss"]) == pytest.approx(result.losses(execution=fresh)[STEPS], rel=1e-5)
    assert merged["metadata"]["export_uri"].endswith("/output/model.tar.gz")
    for package, export in ((adapter, "adapter"), (merged, "merged")):
        report = package["evaluation"]  # read from S3, its checksum checked
        assert "error" not in report and report["export"]["format"] == export, report.get("error")
        # the export (loaded by transformers, the adapter by peft on its base) scored on the windows held out of the
        # training data; the package points at the scores (its metadata records held-out scores of a named channel)
        assert report["held_out"]["tokens"] > 0 and report["held_out"]["eval:perplexity"] > 1
        assert "eval:loss" not in package["metadata"]
        assert package["evaluation_uri"] == package["metadata"]["evaluation_uri"]
        assert report["data"]["sft_fingerprint"] and report["data"]["files"]
    # the adapter on its base and the merged weights score alike (one bf16 rounding apart)
    assert adapter["evaluation"]["held_out"]["eval:loss"] == pytest.approx(merged["evaluation"]["held_out"]["eval:loss"], rel=1e-2)
    second = merged["evaluation"]
    assert second["run_id"] == fresh.execution_id
    # the package names the deployed plan; the evaluation the job's RunConfig, here the rehearsal's scaled one
    assert second["plan_hash"] == result.scaled.config.plan_hash() != merged["metadata"]["plan_hash"]
    assert f"model package: {merged['arn']}" in log and "held-out: eval:loss=" in log
