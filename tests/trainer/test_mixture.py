"""The trainer's mixture of prepared sources (``RunConfig.data.mixture``): windows sampled by weight over the whole
budget, deterministic from the seed, disjoint over ranks, and continued exactly after a resume (even on another
number of ranks)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tiered_training.contract.corpus import MixtureSource
from training.components.data import DataError, build_dataloader

SEQ = 8


@pytest.fixture
def corpus(tmp_path):
    """Source ``web`` (ids 0-99, 40 windows) and source ``code`` (ids 100-199, 5 windows: it repeats)."""
    for name, low, windows in (("web", 0, 40), ("code", 100, 5)):
        folder = tmp_path / name
        folder.mkdir()
        ids = low + np.arange(windows * SEQ + 1) % 100
        ids.astype("<u2").tofile(folder / "unit.bin")
    return tmp_path


MIX = [MixtureSource(name="web", weight=3), MixtureSource(name="code", weight=1)]


def loader(corpus, *, rank=0, world_size=1, micro=2, seed=7, mixture=MIX):
    return build_dataloader(
        corpus, "uint16", SEQ, micro, rank=rank, world_size=world_size, seed=seed, mixture=mixture, vocab_size=200
    )


def take(dl, steps: int) -> list[torch.Tensor]:
    it = iter(dl)
    return [next(it) for _ in range(steps)]


def source_of(window: torch.Tensor) -> str:
    return "code" if int(window[0]) >= 100 else "web"


def test_every_prefix_of_the_stream_follows_the_weights_within_one_window(corpus):
    windows = [w for batch in take(loader(corpus, micro=1), 200) for w in batch]
    code = np.cumsum([source_of(w) == "code" for w in windows])
    assert np.all(np.abs(code - 0.25 * np.arange(1, 201)) <= 1)
    # the small source repeats: 50 windows taken from its 5, each 10 times
    seen = [tuple(w.tolist()) for w in windows if source_of(w) == "code"]
    assert len(seen) == 50 and len(set(seen)) == 5 and all(seen.count(s) == 10 for s in set(seen))
    dl = loader(corpus, micro=1)
    take(dl, 200)
    assert dl.dataset.tokens_seen() == {"web": 150 * SEQ, "code": 50 * SEQ}


def test_the_order_is_the_seeds_and_ranks_read_disjoint_parts_of_one_stream(corpus):
    one = [w for b in take(loader(corpus, micro=2), 20) for w in b]
    assert all(torch.equal(a, b) for a, b in zip(one, [w for b in take(loader(corpus, micro=2), 20) for w in b]))
    other = [w for b in take(loader(corpus, micro=2, seed=8), 20) for w in b]
    assert not all(torch.equal(a, b) for a, b in zip(one, other))
    ranks = [take(loader(corpus, rank=r, world_size=2, micro=1), 20) for r in range(2)]
    interleaved = [w for pair in zip(*ranks) for batch in pair for w in batch]
    assert all(torch.equal(a, b) for a, b in zip(one, interleaved))


def test_a_resumed_run_continues_the_same_windows_even_on_another_number_of_ranks(corpus):
    whole = [w for b in take(loader(corpus, micro=2), 30) for w in b]
    first = loader(corpus, micro=2)
    take(first, 12)
    state = first.state_dict()
    again = loader(corpus, micro=2)
    again.load_state_dict(state)
    resumed = [w for b in take(again, 18) for w in b]
    assert all(torch.equal(a, b) for a, b in zip(whole[24:], resumed)) and len(resumed) == 36
    # the same position read by two ranks, one window each per micro-step
    halves = []
    for rank in range(2):
        dl = loader(corpus, rank=rank, world_size=2, micro=1)
        dl.load_state_dict(state)
        halves.append([w for b in take(dl, 10) for w in b])
    assert all(torch.equal(a, b) for a, b in zip(whole[24:44], [w for pair in zip(*halves) for w in pair]))


def test_a_changed_mixture_does_not_take_the_old_position(corpus):
    first = loader(corpus)
    take(first, 3)
    state = first.state_dict()
    other = loader(corpus, mixture=[MixtureSource(name="web", weight=1), MixtureSource(name="code", weight=1)])
    other.load_state_dict(state)  # applied when the stream starts
    with pytest.raises(DataError, match="the mixture or its data changed"):
        next(iter(other))


def test_a_missing_source_is_named(corpus):
    with pytest.raises(DataError, match="no shards of mixture source books"):
        loader(corpus, mixture=[*MIX, MixtureSource(name="books", weight=1)])


@pytest.mark.torch
def test_the_trainer_reads_a_mixture_and_reports_tokens_and_validation_loss_per_source(tmp_path):
    """One process through ``python -m training``: the mixture's windows, tokens per source in EMF events with a
    Source dimension and in the log, and a validation loss per source from the validation channel's folders."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tiny import tiny_config

    from training.components.metrics import parse_emf_lines

    rng = np.random.default_rng(0)
    for split, size in (("train", 3000), ("validation", 400)):
        for name in ("web", "code"):
            (tmp_path / split / name).mkdir(parents=True)
            rng.integers(0, 60, size).astype("<u2").tofile(tmp_path / split / name / "unit.bin")
    cfg = tiny_config(
        batch={"total_steps": 4},
        checkpoint={"interval_steps": 0, "interval_minutes": 60},
        data={
            "token_dtype": "uint16",
            "seed": 5,
            "mixture": [{"name": "web", "weight": 3}, {"name": "code", "weight": 1}],
        },
        validation={"source": "channel", "interval_minutes": 1e-6, "batches": 1},
        metrics={"interval_seconds": 1e-3},
    )
    (tmp_path / "run.json").write_text(cfg.to_json())
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "training",
            "--config",
            str(tmp_path / "run.json"),
            "--data-dir",
            str(tmp_path / "train"),
            "--checkpoint-dir",
            str(tmp_path / "ck"),
            "--model-dir",
            str(tmp_path / "model"),
        ],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TT_VALIDATION_DIR": str(tmp_path / "validation")},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    events = [e for e in parse_emf_lines(proc.stdout) if "Source" in e]
    last = {e["Source"]: e for e in events}
    # 4 steps of 128 tokens (4 windows of 32), 3 to 1
    assert last["web"]["SourceTokensSeen"] == 12 * 32 and last["code"]["SourceTokensSeen"] == 4 * 32
    assert {e["Source"] for e in events if "SourceValidationLoss" in e} == {"web", "code"}
    assert "metrics: sources: web 384 tokens (75.0%)" in proc.stdout + proc.stderr
    assert json.dumps(last["web"]["_aws"]["CloudWatchMetrics"][0]["Dimensions"]) == '[["Recipe", "Source"]]'
