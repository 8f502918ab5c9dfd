"""The launcher's run checks, before torchrun starts: a resume of another run, model or data is refused with what
changed and what to do; a new run on an InstanceCount that would change the global batch is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import RECIPES

from tiered_training.contract.runconfig import LoraConfig, SftConfig
from tiered_training.planning.planner import plan_file
from training.components.identity import data_fingerprint, identity
from training.launcher import LaunchError, build_launch

DATA = "s3://example-training-data/fineweb-edu/llama3-tokens/"


def _cfg(run_id="run-a", resume=True, data_uri=DATA, **model):
    cfg = plan_file(next(p for p in RECIPES if p.stem == "llama3-8b-fp8")).run_config()
    cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"id": run_id, "resume": resume, "data_uri": data_uri})})
    if model:
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update=model)})
    return cfg


def _data(root: Path, sizes=(400, 800)) -> Path:
    data = root / "data"
    data.mkdir(exist_ok=True)
    for number, size in enumerate(sizes):
        (data / f"shard-{number:05d}.bin").write_bytes(b"\0" * size)
    return data


def _checkpoint(root: Path, cfg, data: Path, step=6, world=8) -> Path:
    checkpoints = root / "checkpoints"
    path = checkpoints / f"step-{step}"
    path.mkdir(parents=True)
    run = {**identity(cfg, data, world), "step": step, "tokens_seen": step * 4_194_304}
    (path / "COMMITTED").write_text(json.dumps({"step": step, "world_size": world, "files": {}, "run": run}))
    return checkpoints


def _launch(cfg, checkpoints, data, hosts=1):
    names = [f"algo-{i + 1}" for i in range(hosts)]
    rc = {"current_host": "algo-1", "hosts": names, "current_instance_type": "ml.p6-b200.48xlarge"}
    return build_launch(rc, cfg.to_hyperparameters(), {"SM_NUM_GPUS": "8"}, checkpoint_dir=checkpoints, data_dir=data)


def test_a_matching_resume_starts(tmp_path):
    data = _data(tmp_path)
    checkpoints = _checkpoint(tmp_path, _cfg(), data)
    assert _launch(_cfg(), checkpoints, data).nnodes == 1


def test_a_resume_with_another_data_uri_is_refused_naming_both(tmp_path):
    data = _data(tmp_path)
    checkpoints = _checkpoint(tmp_path, _cfg(), data)
    with pytest.raises(LaunchError) as raised:
        _launch(_cfg(data_uri="s3://example-training-data/other/"), checkpoints, data)
    message = str(raised.value)
    assert message.startswith("cannot resume run 'run-a': the data changed")
    assert f"resume with DataUri={DATA}" in message and "start a new run" in message


def test_changed_data_at_the_same_uri_is_refused_even_with_the_same_window_count(tmp_path):
    """Shards renamed or resized under the same URI: the fingerprint differs (the trainer's window count may not)."""
    data = _data(tmp_path)
    checkpoints = _checkpoint(tmp_path, _cfg(), data)
    before = data_fingerprint(data)
    (data / "shard-00001.bin").rename(data / "shard-00002.bin")
    assert data_fingerprint(data) != before
    with pytest.raises(LaunchError, match="changed since run 'run-a' saved step 6"):
        _launch(_cfg(), checkpoints, data)


def test_another_model_is_refused(tmp_path):
    data = _data(tmp_path)
    checkpoints = _checkpoint(tmp_path, _cfg(), data)
    with pytest.raises(LaunchError, match=r"the model \(architecture or starting checkpoint\) changed"):
        _launch(_cfg(layers=2), checkpoints, data)


def test_a_resume_of_a_run_without_checkpoints_is_refused(tmp_path):
    data = _data(tmp_path)
    with pytest.raises(LaunchError, match="run 'run-a' has no committed checkpoint to resume"):
        _launch(_cfg(), tmp_path / "empty", data)
    assert _launch(_cfg(resume=False), tmp_path / "empty", data).nnodes == 1  # a new run starts empty


def test_a_new_run_on_an_instance_count_that_breaks_the_global_batch_is_refused(tmp_path):
    """A plan for one 8-GPU node on InstanceCount 3: 24 GPUs cannot keep the batch whole; refused, with the counts."""
    data = _data(tmp_path)
    cfg = _cfg(resume=False)
    with pytest.raises(LaunchError) as raised:
        _launch(cfg, tmp_path / "empty", data, hosts=3)
    assert "InstanceCount 3 (24 GPUs) cannot run the plan as planned" in str(raised.value)
    assert "instance counts this plan supports: 1" in str(raised.value)


# -- fine-tuning: the packed shards' fingerprint and the SFT settings ---------------------------------


def _sft(cfg, **lora):
    """``cfg`` as a fine-tuning run from a Hugging Face checkpoint; LoRA with these settings if any are given."""
    sft = SftConfig(adapter="lora", lora=LoraConfig(**lora)) if lora else SftConfig()
    model = cfg.model.model_copy(update={"init_checkpoint": "s3://example-models/llama-3.1-8b/"})
    return cfg.model_copy(update={"sft": sft, "model": model})


def _packed(root: Path, fingerprint: str) -> Path:
    """Packed SFT shards whose manifest records ``fingerprint`` (the same file sizes for any fingerprint)."""
    data = _data(root)
    (data / "shards.json").write_text(json.dumps({
        "kind": "sft-packed", "sequence_length": 8192, "token_dtype": "uint32", "fingerprint": fingerprint,
        "loss_on": "assistant", "overlong": "drop", "examples": 10, "dropped": 0, "truncated": 0,
        "tokenizer": "meta-llama/Llama-3.1-8B-Instruct", "shards": [{"file": "shard-00000.bin", "sequences": 1}]}))
    return data


def test_a_fine_tuning_resume_on_other_examples_is_refused_naming_the_fingerprints(tmp_path):
    """The same URI and the same shard sizes, other examples (or tokenizer, or packing): the manifest's
    fingerprint is in the checkpoint, and the resume is refused naming both."""
    data = _packed(tmp_path, "a" * 64)
    checkpoints = _checkpoint(tmp_path, _sft(_cfg()), data)
    assert identity(_sft(_cfg()), data, 8)["sft_data_fingerprint"] == "a" * 64
    assert _launch(_sft(_cfg()), checkpoints, data).nnodes == 1
    _packed(tmp_path, "b" * 64)
    with pytest.raises(LaunchError) as raised:
        _launch(_sft(_cfg()), checkpoints, data)
    message = str(raised.value)
    assert "the fine-tuning data at s3://example-training-data/fineweb-edu/llama3-tokens/ is not the data run 'run-a' " \
           "was trained on (packed-shard fingerprint aaaaaaaaaaaa -> bbbbbbbbbbbb" in message
    assert "restore that data, or start a new run" in message


def test_a_fine_tuning_resume_with_other_adapter_settings_is_refused(tmp_path):
    data = _packed(tmp_path, "a" * 64)
    checkpoints = _checkpoint(tmp_path, _sft(_cfg(), rank=16), data)
    assert _launch(_sft(_cfg(), rank=16), checkpoints, data).nnodes == 1
    for other in (_sft(_cfg(), rank=8), _sft(_cfg())):  # another LoRA rank; full fine-tuning
        with pytest.raises(LaunchError, match=r"the fine-tuning settings \(adapter, LoRA rank"):
            _launch(other, checkpoints, data)


def test_a_pretraining_checkpoint_is_not_resumed_as_fine_tuning(tmp_path):
    """A checkpoint saved before the sft part existed (pretraining) has no such part: fine-tuning differs from it."""
    data = _data(tmp_path)
    checkpoints = _checkpoint(tmp_path, _cfg(), data)
    assert "sft" not in _cfg().identity_parts()  # pretraining plan hashes are as before
    with pytest.raises(LaunchError, match=r"the fine-tuning settings \(adapter"):
        _launch(_sft(_cfg()), checkpoints, data)


# -- the checkpoint the trainer would resume decides, as the trainer decides it ------------------------------


def _committed(checkpoints: Path, name: int, cfg, data: Path, *, step: int, world: int = 8) -> None:
    """A resumable checkpoint directory ``step-<name>`` whose manifest says ``step`` (a misnamed copy if they differ)."""
    path = checkpoints / f"step-{name}"
    path.mkdir(parents=True)
    (path / ".metadata").write_bytes(b"x" * 12)
    run = {**identity(cfg, data, world), "step": step, "tokens_seen": step * 4_194_304}
    manifest = {"step": step, "world_size": world, "files": {".metadata": {"bytes": 12}}, "run": run}
    (path / "COMMITTED").write_text(json.dumps(manifest))


def test_a_misnamed_copy_of_another_runs_checkpoint_does_not_block_the_runs_own(tmp_path):
    """run-b's step 12 copied into run-a's prefix as step-20: the trainer skips it (its manifest is of step 12, and
    of another run), so the launcher resumes run-a's own step-6 too, on run-a's host count."""
    data = _data(tmp_path)
    checkpoints = tmp_path / "checkpoints"
    _committed(checkpoints, 6, _cfg(), data, step=6)
    _committed(checkpoints, 20, _cfg(run_id="run-b"), data, step=12, world=16)
    assert _launch(_cfg(), checkpoints, data).nnodes == 1
    _committed(checkpoints, 12, _cfg(run_id="run-b"), data, step=12, world=16)  # named right, still run-b's
    assert _launch(_cfg(), checkpoints, data).nnodes == 1
    # with nothing of its own, the prefix holds only another run's checkpoints: refused, naming it
    import shutil

    shutil.rmtree(checkpoints / "step-6")
    with pytest.raises(LaunchError, match="the checkpoint belongs to run 'run-b', not 'run-a'"):
        _launch(_cfg(), checkpoints, data)


def test_a_resume_on_a_host_count_a_new_run_may_not_use_is_refused(tmp_path):
    """qwen2.5-32b-hybrid needs at least 2 hosts: a resume on 1 is refused before torchrun, as a new run is."""
    plan = plan_file(next(p for p in RECIPES if p.stem == "qwen2.5-32b-hybrid"))
    cfg = plan.run_config()
    cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"id": "run-a", "resume": True, "data_uri": DATA})})
    data = _data(tmp_path)
    checkpoints = tmp_path / "checkpoints"
    _committed(checkpoints, 6, cfg, data, step=6, world=32)
    with pytest.raises(LaunchError, match=r"on 8 GPUs \(1 host\(s\)\): the plan needs at least 2 hosts, as a new run"):
        _launch(cfg, checkpoints, data, hosts=1)
    assert _launch(cfg, checkpoints, data, hosts=2).nnodes == 2
    new = cfg.model_copy(update={"run": cfg.run.model_copy(update={"resume": False})})
    with pytest.raises(LaunchError, match="InstanceCount 1 .* cannot run the plan as planned"):
        _launch(new, tmp_path / "empty", data, hosts=1)


def _tokenized(root: Path, docs: list[str]) -> Path:
    from training.tools.tokenize_to_shards import ByteTokenizer, write_shards

    write_shards(docs, ByteTokenizer(), root / "data", tokens_per_shard=300)
    return root / "data"


def test_a_same_size_change_before_a_resume_is_refused_naming_the_object(tmp_path):
    """The shard rewritten with the same number of tokens and its manifest with it: names and sizes are equal,
    the checksums are not."""
    docs = [letter * 299 for letter in "abcd"]  # with its end-of-text token, one shard each
    data = _tokenized(tmp_path, docs)
    checkpoints = _checkpoint(tmp_path, _cfg(), data)
    _tokenized(tmp_path, ["e" * 299, *docs[1:]])  # same length, other bytes
    with pytest.raises(LaunchError) as raised:
        _launch(_cfg(), checkpoints, data)
    message = str(raised.value)
    assert f"({DATA}shard-00000.bin changed content (sha256 " in message
    assert f"{DATA}shards.json changed content" in message and "shard-00001.bin" not in message


def test_a_deleted_shard_is_named_on_resume(tmp_path):
    data = _data(tmp_path, sizes=(400, 800, 600))
    checkpoints = _checkpoint(tmp_path, _cfg(), data)
    (data / "shard-00001.bin").unlink()
    with pytest.raises(LaunchError, match=rf"saved step 6 \({DATA}shard-00001.bin was deleted\)"):
        _launch(_cfg(), checkpoints, data)


def test_a_checkpoint_saved_before_data_files_still_resumes(tmp_path):
    """Its fingerprint is of names and sizes: compared as such, so upgrading does not refuse a resume."""
    from training.components.identity import names_and_sizes

    data = _data(tmp_path)
    checkpoints = _checkpoint(tmp_path, _cfg(), data)
    marker = checkpoints / "step-6" / "COMMITTED"
    manifest = json.loads(marker.read_text())
    del manifest["run"]["data_files"]
    manifest["run"]["data_fingerprint"] = names_and_sizes(data)
    marker.write_text(json.dumps(manifest))
    assert _launch(_cfg(), checkpoints, data).nnodes == 1
    (data / "shard-00001.bin").write_bytes(b"\0" * 1200)
    with pytest.raises(LaunchError, match="names, sizes or checksums differ"):
        _launch(_cfg(), checkpoints, data)
