"""FailureReason names the cause: the error that is not a consequence of another rank's or host's exit comes first."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

from tiered_training.contract.failures import causes_first, is_consequence
from tiered_training.rehearse.hosts import Host, JobRunner
from training.launcher import failure_reason

# What the surviving ranks record when a peer dies (gloo over TCP, NCCL, c10d), as PyTorch words it.
GLOO = ("DistBackendError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
        "[127.0.0.1]:29733")
NCCL = "DistBackendError: NCCL communicator was aborted on rank 3. Original reason for failure was: ..."
RESET = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection reset by peer"
CAUSE = "DataError: /opt/ml/input/data/train/shard-00007.bin: at token 912: token id 131072, outside the vocabulary"
OOM = "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def test_peer_errors_read_as_consequences_and_causes_do_not():
    assert all(is_consequence(text) for text in (GLOO, NCCL, RESET))
    assert not any(is_consequence(text) for text in (CAUSE, OOM))
    assert causes_first([GLOO, NCCL, CAUSE, OOM]) == [CAUSE, OOM, GLOO, NCCL]


# Timeouts: a collective's, the store's or the rendezvous's wait for a peer that is gone (PyTorch's words), and
# a cause that happens to say "timed out".
PEER_TIMEOUTS = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms "
    "for recv operation to complete",
    "DistBackendError: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, "
    "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600003 milliseconds before timing out.",
    "DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.",
    "RendezvousTimeoutError: ",
    "RuntimeError: Socket Timeout: c10d TCPStore get",
)
READ_TIMEOUT = "TimeoutError: timed out reading shard-00001 from /opt/ml/input/data/train after 300 s"


def test_a_timeout_waiting_for_a_peer_is_a_consequence_and_a_data_read_timeout_is_a_cause():
    assert all(is_consequence(text) for text in PEER_TIMEOUTS)
    assert not is_consequence(READ_TIMEOUT)
    assert not is_consequence("ReadTimeoutError: Read timed out. (read timeout=60) on s3 GetObject train/shard-00003")
    assert causes_first([GLOO, READ_TIMEOUT]) == [READ_TIMEOUT, GLOO]


def test_rehearsal_lists_a_host_that_timed_out_reading_data_before_the_peer_that_lost_it(tmp_path):
    runner = JobRunner.__new__(JobRunner)
    hosts = [_host(tmp_path, "algo-1", f"algo-1 rank-0: {GLOO}"), _host(tmp_path, "algo-2", f"algo-2 rank-1: {READ_TIMEOUT}")]
    attempt = runner._result("Train", "job", {}, hosts, {}, None, 1.0, None)
    assert attempt.failure_reason == f"algo-2 rank-1: {READ_TIMEOUT}; algo-1 rank-0: {GLOO}"


def test_launcher_reports_the_rank_whose_error_is_the_cause(tmp_path):
    """rank-0 recorded the peer's closed connection before rank-1 finished writing its own error."""
    (tmp_path / "rank-1").write_text(CAUSE + "\n")
    (tmp_path / "rank-0").write_text(GLOO + "\n")
    os.utime(tmp_path / "rank-0", (1_000, 1_000))  # older: first by time
    os.utime(tmp_path / "rank-1", (2_000, 2_000))
    assert failure_reason(tmp_path, 1, "algo-2") == f"algo-2 rank-1: {CAUSE}"
    (tmp_path / "rank-1").unlink()
    assert failure_reason(tmp_path, 1, "algo-2") == f"algo-2 rank-0: {GLOO}"  # nothing better recorded


def _host(tmp_path: Path, name: str, reason: str) -> Host:
    root = tmp_path / name
    (root / "output").mkdir(parents=True)
    (root / "output" / "failure").write_text(reason + "\n")
    return Host(name, root, proc=SimpleNamespace(returncode=1))


def test_rehearsal_failure_reason_puts_the_failing_host_first(tmp_path):
    runner = JobRunner.__new__(JobRunner)  # _result reads only the hosts
    hosts = [_host(tmp_path, "algo-1", f"algo-1 rank-0: {GLOO}"), _host(tmp_path, "algo-2", f"algo-2 rank-1: {CAUSE}")]
    attempt = runner._result("Train", "job", {}, hosts, {}, None, 1.0, None)
    assert attempt.status == "Failed"
    assert attempt.failure_reason == f"algo-2 rank-1: {CAUSE}; algo-1 rank-0: {GLOO}"


def test_a_processing_job_killed_by_sigkill_is_reported_as_such_not_by_its_last_line(tmp_path):
    """The Prepare step's process, SIGKILLed (by the OOM killer, say) while it works: the signal comes first."""
    import sys

    runner = JobRunner.__new__(JobRunner)  # process() reads only these
    runner.workdir, runner.repo, runner.say = tmp_path, Path.cwd(), lambda line: None
    runner.s3 = SimpleNamespace(endpoint="http://127.0.0.1:1")
    (tmp_path / "prepare-job/opt/ml").mkdir(parents=True)  # the job's /opt/ml tree (its inputs, downloaded)
    kill = "print('tokenizing shard 3 of 8', flush=True); import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    args = {"AppSpecification": {"ContainerEntrypoint": [sys.executable, "-c", kill]}}
    attempt = runner.process("Prepare", "prepare-job", args)
    assert attempt.status == "Failed"
    assert attempt.failure_reason == ("the process was killed by SIGKILL (exit -9, 137 from a shell): possibly the "
                                      "kernel's OOM killer: check the instance's memory; its last output: tokenizing "
                                      "shard 3 of 8")


def test_a_process_that_exits_on_its_own_is_reported_by_its_last_line():
    from tiered_training.rehearse.hosts import exit_reason

    assert exit_reason(1, ["reading raw/part-1.jsonl", "error: raw/part-1.jsonl line 3: not JSON", ""]) == (
        "error: raw/part-1.jsonl line 3: not JSON")
    assert exit_reason(137, []).startswith("the process was killed by SIGKILL (exit -9, 137 from a shell)")
    assert exit_reason(-11, ["x"]) == "the process was killed by SIGSEGV (exit -11, 139 from a shell); its last output: x"
    assert exit_reason(2, []) == "exited with status 2"
