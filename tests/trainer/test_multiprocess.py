"""Real multi-process training on the CPU: ``torchrun`` with gloo, 2 ranks (4 for a 2x2 hybrid mesh).

Launches are shared: one torchrun per group of assertions, several runs in one launch where no signal ends
it (``driver.py --then``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# Threads per worker process; `make determinism` runs these tests with 1 and 2 (and on one CPU).
WORKER_THREADS = os.environ.get("TT_TEST_THREADS", "1")
DRIVER = HERE / "driver.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
COMBOS = "fp32:none,fp32:selective,fp32:full,bf16:none,bf16:selective,bf16:full"
STEPS = 16


def torchrun(nproc: int, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5", "OMP_NUM_THREADS": WORKER_THREADS, "PYTHONPATH": str(ROOT)}
    cmd = [*TORCHRUN, "--standalone", "--nproc_per_node", str(nproc), str(DRIVER), *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"torchrun failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
    return proc


def then(*args: object) -> list[str]:
    """A further command of the same launch, after the first (``driver.py --then``)."""
    return ["--then", json.dumps([str(a) for a in args])]


# -- loss falls, every precision x checkpointing x sharding ----------------------------


@pytest.fixture(scope="module")
def full_runs(first_runs, resume_root):
    """The full-sharding combos: run in the 2-rank launch of ``first_runs``."""
    return json.loads((resume_root / "full" / "out.json").read_text())


@pytest.fixture(scope="module")
def hybrid_runs(tmp_path_factory, uninterrupted, resume_root):
    """The hybrid combos; then, in the same 4-rank launch, the sharded model built from the uninterrupted
    run's export (test_init_from_hf_checkpoint_loads_exactly_into_sharded_model)."""
    root = tmp_path_factory.mktemp("hybrid")
    torchrun(4, *then("init", "--root", resume_root / "init-run", "--out", resume_root / "init.pt",
                      "--init", resume_root / "model"),
             "losses", "--root", str(root), "--out", str(root / "out.json"), "--sharding", "hybrid",
             "--shard-group", "2", "--combos", COMBOS, "--steps", str(STEPS))
    return json.loads((root / "out.json").read_text())


def _assert_learns(losses: list[float]) -> None:
    assert len(losses) == STEPS
    assert all(loss == loss for loss in losses), f"NaN loss: {losses}"
    late = sum(losses[-4:]) / 4
    assert late < losses[0] - 0.5, f"loss did not fall: first {losses[0]:.3f}, last four {late:.3f} ({losses})"


@pytest.mark.parametrize("combo", COMBOS.split(",") + ["fp8:selective", "fp8row:full"])
def test_loss_falls_full_sharding(full_runs, combo):
    """fp8: tensorwise float8 with FSDP float8 all-gather; fp8row: rowwise (both emulated on the CPU)."""
    _assert_learns(full_runs[combo]["losses"])


def test_loss_falls_unsharded_data_parallel(full_runs):
    """sharding none: every rank holds the whole state (shard dimension 1), gradients all-reduced."""
    entry = full_runs["fp32:none:none"]
    _assert_learns(entry["losses"])
    assert entry["state_bytes"]["measured"]["param"] == entry["state_bytes"]["planned"]["param"]
    assert entry["state_bytes"]["measured"]["optimizer"] == entry["state_bytes"]["planned"]["optimizer"]


@pytest.mark.parametrize("combo", COMBOS.split(","))
def test_loss_falls_hybrid_sharding(hybrid_runs, combo):
    _assert_learns(hybrid_runs[combo]["losses"])


@pytest.mark.parametrize("runs", ["full_runs", "hybrid_runs"])
def test_checkpointing_does_not_change_the_math(runs, request):
    """Recompute gives the same numbers: fp32 losses are equal, bit for bit, across none/selective/full.
    The recomputed forward runs the same kernels on the same inputs in the same process layout, so
    every saved tensor equals the recomputed one and the backward is the same computation."""
    results = request.getfixturevalue(runs)
    reference = results["fp32:none"]["losses"]
    for mode in ("selective", "full"):
        assert results[f"fp32:{mode}"]["losses"] == reference, mode


@pytest.mark.parametrize("runs", ["full_runs", "hybrid_runs"])
def test_planner_state_bytes_match_fsdp_rank0(runs, request):
    """Parameters and AdamW moments on rank 0 of the real FSDP2 model, to the byte."""
    entry = request.getfixturevalue(runs)["fp32:none"]["state_bytes"]
    assert entry["measured"]["param"] == entry["planned"]["param"]
    assert entry["measured"]["optimizer"] == entry["planned"]["optimizer"]


# -- resume: uninterrupted vs SIGTERM vs SIGKILL vs damaged checkpoint ------------------


@pytest.fixture(scope="module")
def resume_root(tmp_path_factory):
    return tmp_path_factory.mktemp("resume")


@pytest.fixture(scope="module")
def first_runs(resume_root):
    """One launch of 2 ranks: the uninterrupted run, the full-sharding combos (``full_runs``), then a run stopped
    by SIGTERM after step 10 (last: the signal ends the launch)."""
    root = resume_root
    (root / "full").mkdir()
    proc = torchrun(2, *then("losses", "--root", root / "full", "--out", root / "full" / "out.json", "--sharding", "full",
                             "--combos", COMBOS + ",fp8:selective,fp8row:full,fp32:none:none", "--steps", STEPS),
                    *then("train", "--root", root, "--ckpt", root / "ck-term", "--model", root / "m-term",
                          "--out", root / "term1.json", "--sigterm-after", "10"),
                    "train", "--root", str(root), "--ckpt", str(root / "ck-full"), "--model", str(root / "model"),
                    "--out", str(root / "full.json"), "--dump-full", str(root / "full.pt"), check=False, timeout=600)
    for done in ("full.json", "full/out.json"):
        assert (root / done).is_file(), f"torchrun failed ({proc.returncode}):\n{proc.stderr[-8000:]}"
    return proc


@pytest.fixture(scope="module")
def uninterrupted(first_runs, resume_root):
    return json.loads((resume_root / "full.json").read_text())


@pytest.fixture(scope="module")
def resumed(first_runs, uninterrupted, resume_root):
    """A run whose rank 1 is SIGKILLed after step 10 (a launch of its own); then one launch that resumes the
    SIGTERM-stopped run, the SIGKILLed run, and a copy of the uninterrupted run whose step-20 lost a shard file.
    Returns the SIGKILLed launch and the resuming one."""
    root = resume_root
    killed = torchrun(2, "train", "--root", str(root), "--ckpt", str(root / "ck-kill"), "--model", str(root / "m-kill"),
                      "--out", str(root / "kill1.json"), "--sigkill-after", "10", "--sigkill-rank", "1", check=False)
    damaged = root / "ck-damaged"
    shutil.copytree(root / "ck-full", damaged)
    (damaged / "step-20" / "__1_0.distcp").unlink()
    proc = torchrun(2, *then("train", "--root", root, "--ckpt", root / "ck-kill", "--model", root / "m-kill",
                             "--out", root / "kill2.json"),
                    *then("train", "--root", root, "--ckpt", damaged, "--model", root / "m-damaged",
                          "--out", root / "damaged.json"),
                    "train", "--root", str(root), "--ckpt", str(root / "ck-term"), "--model", str(root / "m-term"),
                    "--out", str(root / "term2.json"))
    return killed, proc


def test_hooks_get_step_stats_on_every_rank(uninterrupted, resume_root):
    for rank in (0, 1):
        stats = json.loads((resume_root / f"full.json.rank{rank}.stats.json").read_text())
        assert [s["step"] for s in stats] == list(range(1, 21))
        for s in stats:
            assert s["tokens"] == 2 * 32 * 2 and s["world_size"] == 2  # micro-batch 2 x 32 tokens x 2 ranks
            assert s["grad_accum_steps"] == 1 and s["micro_batch_size"] == 2
            assert s["step_time_s"] > 0 and s["tokens_per_second"] > 0 and s["grad_norm"] > 0
            assert s["peak_memory_bytes"] is None  # CUDA only
            assert s["loss"] == uninterrupted["losses"][str(s["step"])]  # the global mean, same on every rank
        assert [s["checkpoint_save_s"] is not None for s in stats].count(True) == 4  # steps 5, 10, 15, 20


def _compare_from(resumed: dict, reference: dict) -> None:
    start = resumed["resumed_from"]
    assert start is not None
    assert resumed["step"] == 20
    expected = {k: v for k, v in reference["losses"].items() if int(k) > start}
    assert resumed["losses"] == expected  # bit for bit: JSON keeps every float digit


def test_uninterrupted_run_commits_and_prunes(uninterrupted, resume_root):
    assert uninterrupted["step"] == 20 and uninterrupted["checkpoint_step"] == 20
    steps = sorted(p.name for p in (resume_root / "ck-full").iterdir())
    assert steps == ["step-10", "step-15", "step-20"]  # keep_last 3 of 5, 10, 15, 20
    assert all((resume_root / "ck-full" / s / "COMMITTED").is_file() for s in steps)


def test_resume_after_sigterm_is_bit_identical(first_runs, resumed, uninterrupted, resume_root):
    root = resume_root
    assert (root / "term1.json").is_file(), first_runs.stderr[-3000:]
    stopped = json.loads((root / "term1.json").read_text())
    assert stopped["stopped"], first_runs.stderr[-3000:]
    assert 10 <= stopped["step"] <= 12 and stopped["checkpoint_step"] == stopped["step"]
    assert "SIGTERM received" in first_runs.stderr and "stopped by SIGTERM" in first_runs.stderr
    for rank in (0, 1):  # every worker returned from the trainer and exited normally
        assert (root / f"term1.json.rank{rank}.exit").read_text() == "0"
    resumed_run = json.loads((root / "term2.json").read_text())
    assert resumed_run["resumed_from"] == stopped["step"]
    _compare_from(resumed_run, uninterrupted)


def test_resume_after_sigkill_of_one_rank_is_bit_identical(resumed, uninterrupted, resume_root):
    root = resume_root
    killed, _ = resumed
    assert killed.returncode != 0
    assert not (root / "kill1.json").exists()
    resumed_run = json.loads((root / "kill2.json").read_text())
    assert resumed_run["resumed_from"] in (10, 5)
    _compare_from(resumed_run, uninterrupted)


def test_damaged_newest_checkpoint_falls_back(resumed, uninterrupted, resume_root):
    """step-20 loses a shard file: resume skips it, says why, and resumes bit-identically from step-15."""
    _, proc = resumed
    assert "skipping checkpoint step-20: __1_0.distcp is listed but missing" in proc.stderr
    assert "resuming from checkpoint step-15" in proc.stderr  # the other resumes start at step 5 to 12
    resumed_run = json.loads((resume_root / "damaged.json").read_text())
    assert resumed_run["resumed_from"] == 15
    _compare_from(resumed_run, uninterrupted)


def test_resume_on_another_world_keeps_the_global_batch_and_the_data(uninterrupted, resume_root):
    """A 2-rank checkpoint resumed by 1 rank: DCP reshards the model and the optimiser, the accumulation
    doubles so the global batch stays 2 x 32 x 2 tokens, and the data continues from its global position.

    The first resumed step starts from the same weights and reads the same windows, so its loss
    differs from the uninterrupted run's only by the order of sums (windows batched in other pairs,
    the mean over ranks instead of over micro-steps): each loss term passes through at most 10
    rounded sums of at most 128 terms (2 layers of GEMMs, the head, the softmax), each within
    128 u = 7.6e-6 relative (u = 2**-24), so the loss is within 10 x 128 u < 1e-4 relative. Another
    window would change it by far more. The later steps are not compared: AdamW turns a rounding
    difference on a parameter with a near-zero gradient into a difference of up to lr a step."""
    root = resume_root
    ckpt = root / "ck-world"
    ckpt.mkdir()
    shutil.copytree(root / "ck-full" / "step-10", ckpt / "step-10")
    proc = torchrun(1, "train", "--root", str(root), "--ckpt", str(ckpt), "--model", str(root / "m-world"),
                    "--out", str(root / "world.json"))
    assert "resuming a checkpoint of 2 ranks on 1" in proc.stderr
    resumed = json.loads((root / "world.json").read_text())
    assert resumed["resumed_from"] == 10 and resumed["step"] == 20
    stats = json.loads((root / "world.json.rank0.stats.json").read_text())
    assert {(s["world_size"], s["grad_accum_steps"], s["tokens"]) for s in stats} == {(1, 2, 2 * 32 * 2)}
    expected = {k: v for k, v in uninterrupted["losses"].items() if int(k) > 10}
    assert resumed["losses"].keys() == expected.keys()
    assert resumed["losses"]["11"] == pytest.approx(expected["11"], rel=10 * 128 * 2.0**-24)
    assert all(loss == loss for loss in resumed["losses"].values())  # no NaN after the resharded optimiser


def test_missing_metadata_falls_back(uninterrupted, resume_root, caplog):
    from training.components.checkpoint import find_resumable

    ckpt = resume_root / "ck-nometa"
    shutil.copytree(resume_root / "ck-full", ckpt)
    (ckpt / "step-20" / ".metadata").unlink()
    (ckpt / "step-25").mkdir()  # an interrupted save: no marker
    step, skipped = find_resumable(ckpt)
    assert step == 15
    assert skipped == [
        "step-25: not committed (no COMMITTED marker: the save did not finish)",
        "step-20: .metadata is missing",
    ]


# -- export ------------------------------------------------------------------------------


def test_safetensors_export_reloads_exactly(uninterrupted, resume_root):
    from transformers import LlamaForCausalLM

    model_dir = resume_root / "model"
    assert sorted(p.suffix for p in model_dir.glob("*.safetensors")) == [".safetensors"]
    reloaded = LlamaForCausalLM.from_pretrained(model_dir)
    trained = torch.load(resume_root / "full.pt")  # rank 0's gathered full state dict of the trained model
    state = reloaded.state_dict()
    assert set(trained) == set(state)
    for name, tensor in trained.items():  # exported in bf16 (export.dtype's default)
        assert state[name].dtype == torch.bfloat16 and torch.equal(state[name], tensor.to(torch.bfloat16)), name
    reference = LlamaForCausalLM(reloaded.config).to(torch.bfloat16)
    reference.load_state_dict({name: tensor.to(torch.bfloat16) for name, tensor in trained.items()})
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # the same bf16 weights (checked exactly above); the two models may pick different kernels
        torch.testing.assert_close(reloaded(ids).logits, reference.eval()(ids).logits, rtol=2e-2, atol=2e-2)


def test_init_from_hf_checkpoint_loads_exactly_into_sharded_model(hybrid_runs, resume_root):
    """Continued training: a 2x2 hybrid-sharded, fully checkpointed model built on the meta device
    loads the exported safetensors exactly, and RoPE's inv_freq is recomputed, not garbage."""
    from transformers import LlamaForCausalLM

    loaded = torch.load(resume_root / "init.pt")  # written by the hybrid launch, from the uninterrupted run's export
    expected = LlamaForCausalLM.from_pretrained(resume_root / "model")
    state = expected.state_dict()
    assert set(loaded["state"]) == set(state)
    for name, tensor in loaded["state"].items():
        assert torch.equal(tensor, state[name]), name
    assert torch.equal(loaded["inv_freq"], expected.model.rotary_emb.inv_freq)
