"""Context parallelism on the CPU: real ``torchrun`` with gloo, 4 ranks, one launch.

The runs compare context parallelism 2 with context parallelism 1 on the same data and
the same initial weights (every sharding layout starts from the model one rank builds,
checked below). ``micro_batch_size`` counts sequences per context-parallel group, so CP 2
with micro-batch 2 on 4 ranks reads the same 4 sequences per step as CP 1 with
micro-batch 1 on 4 ranks. The runs train with SGD with momentum (see ``cp_driver.py``):
the tests are about the split, and SGD's update is continuous in the gradient.

Tolerances, derived (u = 2**-24, fp32's unit roundoff; a sum of n terms in another order is
off by at most n * u times the sum of their magnitudes, Higham, "Accuracy and Stability of
Numerical Algorithms", 2002, section 4.2):

- Gradients. Both runs compute the same terms; the ring merges attention blocks in another
  order than one SDPA call, and the gradient reduce-scatter sums over other groups. The
  longest sums are 128 terms (ffn_size; 4 sequences x 32 tokens), so each gradient is
  within 128 u ~ 7.6e-6 of the other, relative; with clipping to norm 1, in L2 too.
- Weights. SGD with momentum 0.9 adds lr x (the momentum buffer), a linear function of the
  gradients whose weights sum to at most 1 / (1 - 0.9) = 10. Over 6 steps at lr <= 0.5 the
  weights differ by at most 6 x 0.5 x 10 x 7.6e-6 = 2.3e-4 (L2, so for every element too).
  The worst-case n u is about sqrt(n) = 11 times the typical error; that margin covers the
  growth of the difference through the weights over 6 steps (measured: 1.2e-7).
- Losses. The loss moves by at most |grad| x |weight difference| (grad norms stay under 3
  here) plus its own sum's rounding (128 u x 5.6): 3 x 2.3e-4 + 4.3e-5 < 1e-3 (measured:
  5e-7).
- bf16 and fp8 runs round GEMM inputs to bf16 (u = 2**-8): where the fp32 values before a
  rounding differ, the rounded ones differ by one bf16 ulp, so the loss by at most
  2**-8 x 5.6 = 0.022 (measured: 3.6e-4 in bf16, 3.9e-3 in fp8, whose casts round those
  bf16 values again).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tiered_training.contract.runconfig import ParallelConfig

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# Threads per worker process; `make determinism` runs these tests with 1 and 2 (and on one CPU).
WORKER_THREADS = os.environ.get("TT_TEST_THREADS", "1")
DRIVER = HERE / "cp_driver.py"
STEPS = 6
U32 = 2.0**-24  # fp32 unit roundoff
WEIGHT_TOLERANCE = STEPS * 0.5 * 10 * 128 * U32  # steps x lr x momentum sum x gradient error: 2.3e-4
FP32_TOLERANCE = 1e-3  # 3 x WEIGHT_TOLERANCE + 128 u x 5.6
LOW_PRECISION_TOLERANCE = 2.0**-8 * 5.6  # one bf16 ulp of the loss

RUNS = {
    "ref-hybrid": "1:fp32:none:hybrid:1",  # 2 replicas x shard groups of 2
    "ref-full": "1:fp32:none:full:1",  # shard over 4
    "ref-full-bf16": "1:bf16:selective:full:1",
    "ref-full-fp8": "1:fp8:full:full:1",
    "cp-hybrid": "2:fp32:none:hybrid:2:resume",  # replicate 2 x shard 1 x cp 2
    "cp-hybrid-full-ac": "2:fp32:full:hybrid:2",
    "cp-hybrid-selective-ac": "2:fp32:selective:hybrid:2",
    "cp-full": "2:fp32:none:full:2",  # replicate 1 x shard 2 x cp 2
    "cp-full-bf16": "2:bf16:selective:full:2",
    "cp-full-fp8": "2:fp8:full:full:2",
}


# -- the contract: no torch needed ------------------------------------------------------


def test_context_parallel_defaults_to_one():
    assert ParallelConfig(sharding="full", shard_group_size=8).context_parallel == 1


def test_shard_group_counts_the_context_parallel_ranks():
    ParallelConfig(sharding="hybrid", shard_group_size=16, context_parallel=8)
    with pytest.raises(ValueError, match="shard_group_size 4 is not a multiple of context_parallel 8"):
        ParallelConfig(sharding="hybrid", shard_group_size=4, context_parallel=8)


def test_unsharded_data_parallelism_cannot_split_sequences():
    with pytest.raises(ValueError, match="context_parallel 2 needs sharded state"):
        ParallelConfig(sharding="none", shard_group_size=2, context_parallel=2)


def test_sequence_must_split_into_head_and_tail_chunks():
    from tiny import tiny_config

    tiny_config(parallel={"sharding": "full", "shard_group_size": 4, "context_parallel": 4})  # 32 = 8 chunks of 4
    with pytest.raises(ValueError, match="sequence_length 32 is not a multiple of 2 x context_parallel"):
        tiny_config(parallel={"sharding": "full", "shard_group_size": 32, "context_parallel": 32})


def test_context_parallel_travels_as_a_hyperparameter():
    from tiny import tiny_config

    from tiered_training.contract.runconfig import RunConfig

    cfg = tiny_config(parallel={"sharding": "full", "shard_group_size": 4, "context_parallel": 2})
    flat = cfg.to_hyperparameters()
    assert flat["parallel.context_parallel"] == "2"
    assert RunConfig.from_hyperparameters(flat) == cfg


# -- the trainer under torchrun ------------------------------------------------------------


@pytest.fixture(scope="module")
def cp_runs(tmp_path_factory):
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("cp")
    env = {**os.environ, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5", "OMP_NUM_THREADS": WORKER_THREADS, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4", str(DRIVER),
           "--root", str(root), "--out", str(root / "out.json"), "--steps", str(STEPS), "--runs", ",".join(RUNS.values())]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise AssertionError(f"torchrun failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
    out = json.loads((root / "out.json").read_text())
    return {"checks": out["checks"], "init": out["init"], **{name: out[spec] for name, spec in RUNS.items()}}


def _close(a: list[float], b: list[float], tolerance: float) -> None:
    assert len(a) == len(b) == STEPS
    worst = max(abs(x - y) for x, y in zip(a, b))
    assert worst <= tolerance, f"losses differ by {worst:.2e}:\n{a}\n{b}"


@pytest.mark.torch
def test_every_layout_starts_from_the_model_one_rank_builds(cp_runs):
    """On the CPU (no DTensor RNG tracker) each parameter is drawn whole and sliced: the 4 shards
    of the embedding differ, and the gathered 4-rank model equals the 1-rank one, bit for bit."""
    init = cp_runs["init"]
    assert init["embedding_shards_differ"]
    assert init["differs"] and set(init["differs"].values()) == {0.0}, init["differs"]


@pytest.mark.torch
def test_ring_attention_matches_sdpa_over_the_whole_sequence(cp_runs):
    """Output and q/k/v gradients of the sharded ring attention (GQA) equal one SDPA call's.

    Each is a sum over at most 4 heads x 32 positions, merged once more by the ring: within
    256 u of the largest magnitude, times 4 for the cancelling terms of the gradients."""
    for rank in cp_runs["checks"]:
        for name, error in rank["attention_max_error"].items():
            bound = 4 * 256 * U32 * rank["attention_max_abs"][name]
            assert error <= bound, f"rank {rank['rank']}: {name} differs by {error} (bound {bound})"


@pytest.mark.torch
def test_sequences_split_head_and_tail_with_their_positions(cp_runs):
    """16 tokens over 2 ranks: rank 0 keeps positions 0-3 and 12-15, rank 1 keeps 4-11.
    Both ranks of a group read the same sequences; the two groups read different ones."""
    checks = cp_runs["checks"]
    assert [(c["data_rank"], c["cp_rank"]) for c in checks] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    expected = {0: [0, 1, 2, 3, 12, 13, 14, 15], 1: [4, 5, 6, 7, 8, 9, 10, 11]}
    for c in checks:
        shard = c["shard"]
        for row, (inputs, labels, positions) in enumerate(zip(shard["inputs"], shard["labels"], shard["positions"])):
            assert positions == expected[c["cp_rank"]]
            start = 1000 * c["data_rank"] + row * 17  # the token ids are their place in the window
            assert inputs == [start + p for p in positions]
            assert labels == [start + p + 1 for p in positions]


@pytest.mark.torch
def test_loss_over_parts_is_the_token_weighted_mean_of_the_whole(cp_runs):
    for c in cp_runs["checks"]:
        # positive terms: each side of 2 x 32 tokens is within 64 u of the exact sum, relative
        assert c["loss"]["mean_of_parts"] == pytest.approx(c["loss"]["whole"], rel=2 * 64 * U32)
    assert len({c["loss"]["ignored_here"] for c in cp_runs["checks"]}) > 1  # the ignored labels fell unevenly


@pytest.mark.torch
def test_mesh_is_replicate_by_shard_by_cp(cp_runs):
    hybrid, full = cp_runs["cp-hybrid"], cp_runs["cp-full"]
    assert hybrid["mesh"] == full["mesh"] == ["replicate", "shard", "cp"]
    assert hybrid["mesh_shape"] == [2, 1, 2] and hybrid["shard_group_size"] == 2
    assert full["mesh_shape"] == [1, 2, 2] and full["shard_group_size"] == 4
    assert hybrid["attention"] == "context_parallel" and hybrid["cp_size"] == 2
    assert cp_runs["ref-full"]["attention"] == "sdpa" and cp_runs["ref-full"]["cp_size"] == 1


@pytest.mark.torch
@pytest.mark.parametrize("sharding", ["hybrid", "full"])
def test_context_parallel_losses_equal_unsplit_losses(cp_runs, sharding):
    _close(cp_runs[f"cp-{sharding}"]["losses"], cp_runs[f"ref-{sharding}"]["losses"], FP32_TOLERANCE)


@pytest.mark.torch
def test_validation_loss_with_context_parallel_equals_unsplit(cp_runs):
    """Held-out windows, split over the CP group like training batches."""
    cp, ref = cp_runs["cp-hybrid"]["validation_losses"], cp_runs["ref-hybrid"]["validation_losses"]
    _close(cp, ref, FP32_TOLERANCE)


@pytest.mark.torch
@pytest.mark.parametrize("ac", ["full", "selective"])
def test_activation_checkpointing_with_context_parallel(cp_runs, ac):
    _close(cp_runs[f"cp-hybrid-{ac}-ac"]["losses"], cp_runs["ref-hybrid"]["losses"], FP32_TOLERANCE)


@pytest.mark.torch
@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_low_precision_with_context_parallel_equals_unsplit(cp_runs, precision):
    """bf16 (selective checkpointing) and emulated fp8 tensorwise with float8 all-gather (full
    checkpointing), against CP 1 in the same precision: within one bf16 ulp of the loss."""
    cp, ref = cp_runs[f"cp-full-{precision}"]["losses"], cp_runs[f"ref-full-{precision}"]["losses"]
    _close(cp, ref, LOW_PRECISION_TOLERANCE)


@pytest.mark.torch
def test_context_parallel_run_resumes_bit_identically(cp_runs):
    run = cp_runs["cp-hybrid"]
    assert run["resumed_from"] == 3
    assert run["resumed_losses"] == run["losses"][3:]


@pytest.mark.torch
def test_export_after_context_parallel_matches_unsplit_training(cp_runs):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    def weights(model_dir: str) -> dict:
        files = sorted(Path(model_dir).glob("*.safetensors"))
        assert files, f"no safetensors in {model_dir}"
        return {k: v for f in files for k, v in load_file(f).items()}

    config = json.loads((Path(cp_runs["cp-hybrid"]["model_dir"]) / "config.json").read_text())
    assert config.get("_attn_implementation") in (None, "sdpa")  # the ring is a training-time choice
    cp, ref = weights(cp_runs["cp-hybrid"]["model_dir"]), weights(cp_runs["ref-hybrid"]["model_dir"])
    resumed = weights(cp_runs["cp-hybrid"]["resumed_model_dir"])
    assert set(cp) == set(ref) == set(resumed)
    for key in ref:
        worst = (cp[key] - ref[key]).abs().max().item()
        assert worst <= WEIGHT_TOLERANCE, f"{key} differs by {worst:.2e}"
        assert torch.equal(resumed[key], cp[key]), key  # the same computation: bit for bit
