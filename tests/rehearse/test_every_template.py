"""Every template in ``recipes/`` rehearses: its own pipeline definition, a scaled-down model, data and
checkpoints through one shared local S3 (moto), the shortest run (2 steps, no probe), on 1 simulated host of 2 CPU
workers: 2 ranks, as on 2 hosts of 1, with one torchrun agent per job instead of two (about a quarter of a
rehearsal's CPU time). What a template changes (model, precision, sequence length, task) does not depend on the
host count; hosts are rehearsed in test_rehearsal.py, test_sft_rehearsal.py, test_prepare_rehearsal.py,
test_corpus_rehearsal.py and here by INTERRUPTED, on 2 hosts of 1 worker with a SIGTERM and a restart. One, PROBED, runs its probe of all
candidates with the planner's first choice slowed on purpose (``--slow-candidate 1``): the probe
measures each in its own launch, the gate passes, and Train runs the measured fastest, another one. qwen2.5-32b-hybrid is rehearsed
in test_rehearsal.py (probe, gate, a host killed during a save). A template with
``model.init_checkpoint`` starts from the random checkpoint the rehearsal puts in its model channel;
a fine-tuning template (``task: sft``) trains on packed chat shards the rehearsal prepares."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("moto")

from tiered_training.rehearse.run import Options, rehearse  # noqa: E402
from tiered_training.rehearse.s3 import LocalS3  # noqa: E402

pytestmark = pytest.mark.torch

REPO = Path(__file__).resolve().parents[2]
ALL = sorted(p.name for p in (REPO / "recipes").glob("*.yaml"))
ELSEWHERE = {"qwen2.5-32b-hybrid.yaml": "test_rehearsal.py",  # rehearsed there, with a host lost and a restart
             "qwen2.5-32b-lora.yaml": "test_sft_rehearsal.py",  # there, with a kill, a resume and both export forms
             "llama3-1b-bf16.yaml": "test_runs_rehearsal.py",  # there, in five executions, one of them segmented
             "llama3.1-8b-tools-sft.yaml": "test_prepare_rehearsal.py",  # there: Prepare from raw data, and its reuse
             "llama3-1b-raw-mixture.yaml": "test_corpus_rehearsal.py"}  # there: Prepare of raw corpora on 2 instances
TEMPLATES = [name for name in ALL if name not in ELSEWHERE]
INTERRUPTED = "llama3-8b-fp8.yaml"  # the flagship: an init checkpoint, and a spot interruption
PROBED = "llama3-8b-fp8-p5.yaml"  # auto tuning: the planner's candidates (3 to 5), the first slowed


@pytest.fixture(scope="module")
def shared_s3():
    with LocalS3() as s3:  # the rehearsals below attach to this one moto server
        yield s3


def test_every_template_is_rehearsed_here_or_elsewhere():
    assert set(TEMPLATES) | set(ELSEWHERE) == set(ALL) and {INTERRUPTED, PROBED} <= set(TEMPLATES)
    for name, test in ELSEWHERE.items():
        assert f"recipes/{name}" in (Path(__file__).parent / test).read_text()


@pytest.mark.parametrize("template", TEMPLATES)
def test_template_rehearses(template, shared_s3, tmp_path):
    interrupt = "sigterm@1" if template == INTERRUPTED else None
    clean = template == TEMPLATES[0]  # --clean: the work directory (here, one that existed before) is left empty
    probed = template == PROBED
    hosts, workers = (2, 1) if interrupt else (1, 2)
    out = io.StringIO()
    result = rehearse(Options(REPO / "recipes" / template, hosts=hosts, workers=workers, steps=3 if interrupt else 2,
                              params={} if probed else {"SkipProbe": "true"}, interrupt=interrupt, workdir=tmp_path,
                              clean=clean, slow_candidate="1" if probed else None), out)
    log = out.getvalue()
    assert result.ok, log[-6000:]
    if probed:
        _check_the_probe_chose_by_measurement(result, log, tmp_path)
    if clean:
        assert "removed at the end: --clean" in log and "(removed with the work directory: --clean)" in log
        assert tmp_path.is_dir() and not any(tmp_path.iterdir())
    else:
        assert (tmp_path / "summary.json").is_file() and Path(result.exported["dir"]).is_dir()
    attempts = result.train_attempts()
    assert attempts and attempts[-1].status == "Completed", log[-6000:]
    assert result.exported, log[-3000:]
    lines = [line for attempt in attempts for _, _, line in attempt.log]
    if "init_checkpoint:" in (REPO / "recipes" / template).read_text():
        assert "init checkpoint: a random Hugging Face checkpoint" in log
        assert any("loading initial weights from" in line for line in lines), log[-3000:]
    else:
        assert not any("loading initial weights from" in line for line in lines)
    assert re.search(rf"^  \S+ attempt 1: {hosts} host\(s\) x {workers} CPU worker\(s\)", log, re.MULTILINE), log[-3000:]
    if interrupt:
        assert [a.status for a in attempts] == ["Interrupted", "Completed"], log[-6000:]
        assert result.interrupted
    # Registered, with its final metrics; a DPO run's preference accuracy (trl's rewards/accuracies) among them.
    assert result.packages, log[-3000:]
    metadata = result.packages[-1]["metadata"]
    assert "train:loss" in metadata, metadata
    if "task: dpo" in (REPO / "recipes" / template).read_text():
        assert 0 <= float(metadata["train:rewards/accuracies"]) <= 1, metadata


def _check_the_probe_chose_by_measurement(result, log: str, workdir: Path) -> None:
    execution = result.execution
    found = execution.metrics["Probe"]
    # each candidate measured (its own launch printed its figures), the first slowed on purpose
    count = len(result.candidates)  # the plan's probe candidates, each measured
    assert 3 <= count <= 5, result.candidates
    numbers = range(1, count + 1)
    measured = {n: found[f"probe:candidate{n}:tokens_per_second"] for n in numbers}
    assert all(value > 0 for value in measured.values()), found
    (probe,) = execution.jobs["Probe"]
    said = probe.detail["candidate_lines"]
    for n in numbers:
        assert any(line.startswith(f"probe candidate {n} (") for line in said), said
    assert "slowed on purpose" in next(line for line in said if line.startswith("probe candidate 1 ("))
    chosen = int(found["probe:best_candidate"])
    assert chosen != 1 and measured[chosen] == max(measured.values()) > measured[1]
    gate = [e for e in execution.trace if e.kind == "condition" and e.step == "Gate"]
    assert gate and gate[0].data["outcome"] is True
    # Train runs the chosen one, and the run's record says why
    (train,) = result.train_attempts()
    assert train.detail["run_candidate"] == chosen
    assert train.detail["candidate_lines"] == [
        line for line in train.detail["candidate_lines"] if line.startswith(f"training candidate {chosen} of {count} (")]
    assert train.detail["candidate_lines"]
    record = json.loads((workdir / "summary.json").read_text())["executions"][0]["candidates"]
    assert record["probe"]["chosen"] == chosen
    assert [row["status"] for row in record["probe"]["candidates"]].count("chosen") == 1
    assert record["probe"]["candidates"][0]["slowed"] is True
    (why,) = record["train"]
    assert why["candidate"] == chosen and "the probe's choice" in why["why"] and "slowed on purpose" in why["why"]
    assert f"Train attempt 1: candidate {chosen} (the probe's choice" in log
    assert "TIERED_TRAINING_SLOW_CANDIDATE=1:0.5 in the Probe job's environment only" in log
