"""Gradient reduction on two simulated hosts (2 x 2 ranks on gloo, a directory per host): the
loss of a step is its token mean, whatever the label masks;
hybrid sharding all-reduces across replicas once per optimiser step, with the losses of
an all-reduce per micro-batch. See ``grad_driver.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
UNITS = 4  # FSDP units with parameters: the embedding, two decoder layers, the norm with the head
ACCUM = 3


def _port() -> int:
    from tiered_training.contract.ports import loopback_port

    return loopback_port()  # below the ephemeral range: no other process gets it by chance


def launch_hosts(tmp: Path, command: str, hosts: int = 2, per_host: int = 2) -> list[dict]:
    """One torchrun agent per simulated host, each in its own directory; the per-rank results."""
    env = {**os.environ, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    port = _port()
    procs = []
    for host in range(hosts):
        directory = tmp / f"host-{host}"
        directory.mkdir()
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(hosts), "--node_rank", str(host),
               "--nproc_per_node", str(per_host), "--master_addr", "127.0.0.1", "--master_port", str(port),
               str(HERE / "grad_driver.py"), command, "--root", str(directory), "--out", str(directory / "result")]
        procs.append(subprocess.Popen(cmd, cwd=directory, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outputs = [proc.communicate(timeout=300)[0] for proc in procs]
    for proc, output in zip(procs, outputs):
        assert proc.returncode == 0, output[-6000:]
    return [json.loads((tmp / f"host-{r // per_host}" / f"result.rank{r}.json").read_text())
            for r in range(hosts * per_host)]


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    return launch_hosts(tmp_path_factory.mktemp("grad-sync"), "hybrid")


def test_replicas_all_reduce_once_per_optimiser_step(hybrid):
    for rank, result in enumerate(hybrid):
        # this rank's replica is the rank holding the same shard on the other host
        assert result["once_per_step"]["replicate_ranks"] == [rank % 2, rank % 2 + 2]
        assert result["once_per_step"]["replica_all_reduces"] == [UNITS] * 4
        assert result["every_micro_batch"]["replica_all_reduces"] == [UNITS * ACCUM] * 4


def test_losses_equal_an_all_reduce_per_micro_batch(hybrid):
    """Tolerance: one step's gradient is the same 6 fp32 terms (2 replicas x 3 micro-batches) summed
    in another order; each order is within (n - 1) u sum|t| of the exact sum (u = 2^-24), so the
    two differ by at most 2 (n - 1) u sum|t|, element by element, which the driver checks with the
    measured sum|t|. AdamW then moves the weights by lr times a normalised gradient, and the loss
    of the next steps by a relative amount of the same order (1e-7 .. 1e-6): 1e-5 bounds it, as
    it does for recomputation (test_multiprocess.py)."""
    for result in hybrid:
        once, every = result["once_per_step"]["losses"], result["every_micro_batch"]["losses"]
        assert len(once) == 4
        assert once[0] == every[0]  # the same weights and data: the first loss is bit-identical
        assert once == pytest.approx(every, rel=1e-5)
        step = result["one_step"]
        assert (step["calls_once"], step["calls_every"]) == (UNITS, UNITS * ACCUM)
        assert step["max_delta_over_bound"] <= 1.0
    assert hybrid[0]["once_per_step"]["losses"] == hybrid[3]["once_per_step"]["losses"]  # one loss, every rank


def test_masked_labels_give_the_full_batch_gradient(hybrid):
    """Ranks and micro-batches with 0 to 64 of 64 labels masked: the trainer's gradient equals that
    of the whole step's batch in one forward (mean over its valid labels).

    Tolerance: both are fp32 sums of the same n <= 384 per-token terms in another order, so an
    element differs by at most 2 (n - 1) u sum|t| (u = 2^-24), 4.6e-5 sum|t|; gradients of
    different tokens mostly add rather than cancel (sum|t| within 2 |g|), hence 1e-4 of the norm.
    Averaging per-micro-batch, per-rank means (the normalisation this replaces) is off by order 1."""
    masked = hybrid[0]["masked"]
    assert masked["names_match"]
    assert masked["relative_error"] < 1e-4, masked
    assert masked["mean_of_means_relative_error"] > 0.1, masked  # the masks are unequal enough to tell
    assert masked["loss"] == pytest.approx(masked["full_batch_loss"], rel=1e-5)


def test_python_garbage_collection_runs_only_when_the_trainer_says(hybrid):
    """Automatic collection is off while training; the trainer collects generation 1 before the
    first step and every GC_EVERY_STEPS steps (2 in the driver: before step 3 of 4), on every rank."""
    for result in hybrid:
        gc = result["once_per_step"]["gc"]
        assert gc["enabled_in_steps"] == [False] * 4
        assert gc["enabled_after"] is True
        assert gc["collections"] == [1, 1], gc
