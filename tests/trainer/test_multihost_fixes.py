"""What a multi-host run needs from the trainer: bounded pruning, checksums, a global data position,
restarts on another host count, out-of-vocabulary shards, and the launcher's exit status after SIGTERM."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

from tiny import tiny_config, write_learnable_shards  # noqa: E402

from tiered_training.contract.world import WorldSizeError, accumulation, resume_accumulation  # noqa: E402
from training.components.checkpoint import plan_pruning  # noqa: E402
from training.components.data import DataError, PackedTokenWindows  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


# -- pruning ------------------------------------------------------------------------------


def test_a_damaged_committed_checkpoint_never_counts_as_kept():
    # step-20 carries COMMITTED but failed its check at resume; step-15 was resumed from (verified).
    assert plan_pruning([25, 20, 15, 10], verified={15, 25}, damaged={20}, keep_last=1) == [10, 15, 20]
    assert plan_pruning([20, 15, 10], verified={15}, damaged={20}, keep_last=1) == [10, 20]
    # Not yet keep_last verified ones: nothing unverified is deleted, only the damaged.
    assert plan_pruning([20, 15, 10], verified={15}, damaged={20}, keep_last=3) == [20]
    assert plan_pruning([30, 25], verified={25}, damaged=set(), keep_last=1, in_flight=30) == []


# -- world size ---------------------------------------------------------------------------


def test_another_world_keeps_the_global_batch_or_is_refused_with_the_counts_that_work():
    cfg = tiny_config(batch={"grad_accum_steps": 4, "global_batch_tokens": 2 * 32 * 4 * 4, "ramp_start_accum_steps": 2,
                             "ramp_steps": 4}, hardware={"gpus_per_node": 2})
    fn, exact = accumulation(cfg, 2)
    assert exact and [fn(s) for s in range(6)] == [4, 4, 6, 6, 8, 8]  # the ramp 2..4, doubled at half the ranks
    assert not accumulation(cfg, 8)[1]  # 3 x 4 / 8 is no whole number: a fresh run keeps the plan's accumulation
    assert resume_accumulation(cfg, 4, 2)(5) == 8
    # 1 host (2 GPUs) would keep the batch, but full sharding over fewer GPUs than planned needs more memory
    with pytest.raises(WorldSizeError, match=r"on 4 GPUs on 6 GPUs .* instance counts that can resume it: 2$"):
        resume_accumulation(cfg, 4, 6)


def test_with_context_parallelism_the_global_batch_counts_data_parallel_ranks():
    # 2 data-parallel ranks of a context-parallel group of 2: 4 GPUs planned
    cfg = tiny_config(parallel={"sharding": "full", "shard_group_size": 4, "context_parallel": 2},
                      batch={"grad_accum_steps": 2, "global_batch_tokens": 2 * 32 * 2 * 2}, hardware={"gpus_per_node": 2})
    fn, exact = accumulation(cfg, 4)
    assert exact and fn(5) == 2
    fn, exact = accumulation(cfg, 2)  # one CP group: twice the accumulation
    assert exact and fn(5) == 4
    with pytest.raises(WorldSizeError, match="context parallelism of 2 needs a multiple of 2 GPUs"):
        resume_accumulation(cfg, 4, 3)


# The launcher's refusal of a restart on another host count, with real checkpoints: test_checkpoint_lineage.py.


# -- data -----------------------------------------------------------------------------------


def _windows(data, world, mb, count, position=0):
    out = []
    for rank in range(world):
        ds = PackedTokenWindows(data, "uint16", 32, rank=rank, world_size=world, seed=3, micro_batch_size=mb, vocab_size=256)
        ds.load_state_dict({"position": position, "windows": ds.windows, "seed": 3})
        it = iter(ds)
        out.append([tuple(next(it).tolist()) for _ in range(count)])
    return out


def test_the_data_position_is_global_so_another_world_reads_the_same_windows(tmp_path):
    write_learnable_shards(tmp_path, tokens=4000)
    two = _windows(tmp_path, 2, 2, 4)  # two micro-steps of 2 ranks x 2 windows
    four = _windows(tmp_path, 4, 2, 2)  # one micro-step of 4 ranks x 2 windows
    # one micro-step of the job reads the same 8 windows on either world; rank r takes every world-th
    assert sorted(w for rank in four for w in rank) == sorted(w for rank in two for w in rank)
    assert [four[r][j] for j in range(2) for r in range(4)] == [two[r][j] for j in range(4) for r in range(2)]
    ds = PackedTokenWindows(tmp_path, "uint16", 32, rank=0, world_size=2, seed=3, micro_batch_size=2)
    it = iter(ds)
    for _ in range(4):
        next(it)
    assert ds.state_dict()["position"] == 8  # two micro-steps of the whole job


def test_out_of_vocabulary_ids_are_caught_naming_the_shard(tmp_path):
    np.full(200, 300, dtype=np.uint16).tofile(tmp_path / "shard-00000.bin")
    with pytest.raises(DataError, match=r"shard-00000.bin: at token \d+: token id 300, outside the model's vocabulary of 256"):
        next(iter(PackedTokenWindows(tmp_path, "uint16", 32, rank=0, world_size=1, seed=0, vocab_size=256)))
    entry = {"file": "shard-00000.bin", "tokens": 200, "bytes": 400, "max_token_id": 300}
    entry["sha256"] = hashlib.sha256((tmp_path / "shard-00000.bin").read_bytes()).hexdigest()
    (tmp_path / "shards.json").write_text(json.dumps({"shards": [entry]}))
    with pytest.raises(DataError, match="shard-00000.bin: its manifest says token id 300"):
        PackedTokenWindows(tmp_path, "uint16", 32, rank=0, world_size=1, seed=0, vocab_size=256)


def test_out_of_vocabulary_id_without_a_manifest_fails_when_the_data_opens(tmp_path):
    """Found at start-up (before step 1), with its shard and offset, wherever its window falls
    in the order; the ranks split the scan, so the rank that holds the shard reports it."""
    np.full(40_000, 5, dtype=np.uint16).tofile(tmp_path / "shard-00000.bin")
    bad = np.full(40_000, 5, dtype=np.uint16)
    bad[31_337] = 256
    bad.tofile(tmp_path / "shard-00001.bin")
    with pytest.raises(DataError, match=r"shard-00001.bin: at token 31337: token id 256, outside the model's vocabulary of 256"):
        PackedTokenWindows(tmp_path, "uint16", 32, rank=0, world_size=1, seed=0, vocab_size=256)
    PackedTokenWindows(tmp_path, "uint16", 32, rank=0, world_size=2, seed=0, vocab_size=256)  # rank 1 scans shard 1
    with pytest.raises(DataError, match="shard-00001.bin: at token 31337"):
        PackedTokenWindows(tmp_path, "uint16", 32, rank=1, world_size=2, seed=0, vocab_size=256)
    PackedTokenWindows(tmp_path, "uint16", 32, rank=0, world_size=1, seed=0, vocab_size=257)  # in a larger vocabulary


# -- checksums: flipped bytes are found at load ------------------------------------------------

SCRIPT = """
import json, sys
sys.path[:0] = [{root!r}, {tests!r}]
from pathlib import Path
from tiny import tiny_config
from training.paths import Paths
from training.trainer import run
root = Path({tmp!r})


def train(out, steps, keep):
    cfg = tiny_config(batch={{"total_steps": steps}},
                      checkpoint={{"interval_minutes": 0, "interval_steps": 2, "keep_last": keep, "shutdown_deadline_seconds": 30}})
    result = run(cfg, Paths(root / "data", root / "ckpt", root / "model"), export=False)
    (root / out).write_text(json.dumps({{"resumed_from": result.resumed_from, "losses": result.losses}}))


train("a.json", 4, 2)  # checkpoints at 2 and 4
shard = root / "ckpt/step-4/__0_0.distcp"
data = bytearray(shard.read_bytes())
for i in range(len(data) // 2, len(data) // 2 + 64):
    data[i] ^= 0xFF
shard.write_bytes(bytes(data))  # same size: only a checksum can tell
print("FLIPPED", file=sys.stderr, flush=True)
train("b.json", 4, 1)
"""


def test_flipped_bytes_in_a_shard_are_found_and_the_previous_checkpoint_is_used(tmp_path):
    """Both runs in one process (its imports cost seconds): the first writes step-2 and step-4, bytes of step-4
    are flipped, the second resumes."""
    write_learnable_shards(tmp_path / "data")
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(root=str(ROOT), tests=str(Path(__file__).parent), tmp=str(tmp_path)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, second = (json.loads((tmp_path / out).read_text()) for out in ("a.json", "b.json"))
    log = proc.stderr.split("FLIPPED\n", 1)[1]  # the second run's
    assert "skipping checkpoint step-4: __0_0.distcp fails its checksum" in log
    assert second["resumed_from"] == 2
    assert second["losses"] == {k: v for k, v in first["losses"].items() if int(k) > 2}
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-4"]  # rewritten, verified, kept alone


# -- the launcher: SIGTERM exits 0; any failure leaves one line in /opt/ml/output/failure ----------


def _opt_ml(tmp_path, cfg, data_writer):
    root = tmp_path / "opt/ml"
    (root / "input/config").mkdir(parents=True)
    (root / "input/config/hyperparameters.json").write_text(json.dumps(cfg.to_hyperparameters()))
    (root / "input/config/resourceconfig.json").write_text(json.dumps(
        {"current_host": "algo-1", "hosts": ["algo-1"], "current_instance_type": "cpu", "network_interface_name": "lo"}))
    data_writer(root / "input/data/train")
    return root


def _launch(root):
    env = {**os.environ, "TIERED_TRAINING_OPT_ML": str(root), "TIERED_TRAINING_MASTER_ADDR": "127.0.0.1",
           "TIERED_TRAINING_MASTER_PORT": str(_port()), "SM_NUM_GPUS": "2", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.Popen([sys.executable, "-m", "training.launcher", "train"], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _port() -> int:
    from tiered_training.contract.ports import loopback_port

    return loopback_port()  # below the ephemeral range: no other process gets it by chance


@pytest.mark.torch
def test_sigterm_ends_in_a_committed_checkpoint_and_exit_status_0(tmp_path):
    cfg = tiny_config(batch={"total_steps": 50})
    root = _opt_ml(tmp_path, cfg, write_learnable_shards)
    proc = _launch(root)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if re.search(r"INFO: step +3 \|", line):
            proc.send_signal(signal.SIGTERM)  # what SageMaker sends the container's entry point
    assert proc.wait(timeout=120) == 0, "".join(lines)[-4000:]
    text = "".join(lines)
    assert "SignalException" not in text and "stopped by SIGTERM" in text
    assert any((p / "COMMITTED").is_file() for p in (root / "checkpoints").iterdir())
    assert not (root / "output/failure").exists()


# -- a non-finite step: skipped on every rank, and the job stops after too many in a row ------------


@pytest.mark.torch
def test_a_nan_on_one_rank_is_skipped_everywhere_and_too_many_in_a_row_stop_the_job(tmp_path):
    from training.components.optim import lr_factor

    cfg = tiny_config(batch={"total_steps": 20}, optimizer={"max_nonfinite_skips": 2},
                      checkpoint={"interval_minutes": 0, "interval_steps": 5, "keep_last": 1, "shutdown_deadline_seconds": 60})
    root = _opt_ml(tmp_path, cfg, write_learnable_shards)
    env = {**os.environ, "TIERED_TRAINING_OPT_ML": str(root), "TIERED_TRAINING_MASTER_ADDR": "127.0.0.1",
           "TIERED_TRAINING_MASTER_PORT": str(_port()), "SM_NUM_GPUS": "2", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           # rank 1 alone sees a NaN loss: once at the 3rd step attempt, then from the 9th on
           "TT_TEST_NAN_RANK": "1", "TT_TEST_NAN_AT": "3,9-"}
    proc = subprocess.run([sys.executable, str(ROOT / "tests/trainer/nonfinite_driver.py"), "launch"], cwd=root,
                          env=env, capture_output=True, text=True, timeout=240)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-4000:]
    # rank 0 logs every attempt; its own loss was finite, yet it skipped with rank 1
    steps = re.findall(r"INFO: step +(\d+) \| loss (\S+) \| grad_norm \S+ \| lr (\S+) [^\n]*?(SKIPPED|$)", text, re.M)
    assert [(int(s), bool(skip)) for s, _, _, skip in steps] == [
        (1, False), (2, False), (2, True), (3, False), (4, False), (5, False), (6, False), (7, False),
        (7, True), (7, True), (7, True)], text[-4000:]
    # a skipped step leaves the LR schedule where it was: step N used the schedule's N-th rate
    applied = [(int(s), lr) for s, _, lr, skip in steps if not skip]
    assert applied == [(n, f"{cfg.optimizer.lr * lr_factor(n - 1, cfg.optimizer, 20):.3e}") for n in range(1, 8)]
    failure = (root / "output/failure").read_text()
    assert failure.startswith("algo-1 rank-") and "NonFiniteError: 3 steps in a row after step 7" in failure, failure
    assert "optimizer.max_nonfinite_skips is 2" in failure
    # the last healthy checkpoint (step 5) is the one left; nothing non-finite was saved
    held = sorted(p.name for p in (root / "checkpoints").iterdir())
    assert held == ["step-5"] and (root / "checkpoints/step-5/COMMITTED").is_file(), held
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(root / "checkpoints/step-5", tmp_path / "step-5.pt")
    model = torch.load(tmp_path / "step-5.pt", weights_only=False)["model"]
    assert all(torch.isfinite(value).all() for value in model.values())


# -- a full disk during a save: not committed, the reason names the disk, the checkpoints before it intact -----


@pytest.mark.torch
@pytest.mark.parametrize("where", ["files", "marker"])
def test_a_full_disk_during_a_save_leaves_it_uncommitted_and_the_failure_names_the_disk(tmp_path, where):
    """Rank 1 finds the disk full writing its files of step-6, or rank 0 writing step-6's COMMITTED marker: every rank
    ends with the same reason, the host and the path first (no bare OSError, no peer's closed connection)."""
    cfg = tiny_config(batch={"total_steps": 12},
                      checkpoint={"interval_minutes": 0, "interval_steps": 3, "keep_last": 2, "shutdown_deadline_seconds": 60})
    root = _opt_ml(tmp_path, cfg, write_learnable_shards)
    env = {**os.environ, "TIERED_TRAINING_OPT_ML": str(root), "TIERED_TRAINING_MASTER_ADDR": "127.0.0.1",
           "TIERED_TRAINING_MASTER_PORT": str(_port()), "SM_NUM_GPUS": "2", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "TT_TEST_ENOSPC_RANK": "1", "TT_TEST_ENOSPC_STEP": "6", "TT_TEST_ENOSPC_MARKER": str(int(where == "marker"))}
    proc = subprocess.run([sys.executable, str(ROOT / "tests/trainer/nonfinite_driver.py"), "launch"], cwd=root,
                          env=env, capture_output=True, text=True, timeout=240)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-4000:]
    failure = (root / "output/failure").read_text()
    assert failure.count("\n") == 1, failure
    first = {
        "files": f"the disk is full on host algo-1 at {root}/checkpoints/step-6/__1_0.distcp (ENOSPC) while writing "
                 "step-6: checkpoint step-6 is NOT committed",
        "marker": f"the disk is full on host algo-1 at {root}/checkpoints/step-6/COMMITTED (ENOSPC) while committing "
                  "checkpoint step-6 (its COMMITTED marker): checkpoint step-6 is NOT committed",
    }[where]
    # every rank ends with the same reason: the first recorded, whichever rank it was
    assert re.sub(r"^algo-1 rank-[01]: ", "", failure).startswith(f"CheckpointDiskFull: {first}"), failure
    rank = {"files": 1, "marker": 0}[where]
    assert "No space left on device" in failure and f"host algo-1 rank {rank}: the write failed" in failure
    assert "the newest: step-3" in failure and "CheckpointException" not in failure, failure
    assert "Connection closed" not in text and "Traceback" not in failure, text[-4000:]
    # the save that failed is not committed; the one before it is, and a restart would resume it
    assert (root / "checkpoints/step-3/COMMITTED").is_file()
    assert not (root / "checkpoints/step-6/COMMITTED").exists()
    assert not (root / "checkpoints/step-6/COMMITTED.tmp").exists()
    from training.components.checkpoint import find_resumable

    assert find_resumable(root / "checkpoints")[0] == 3
