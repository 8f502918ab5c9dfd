"""The launcher: SageMaker's files in, torchrun argv and environment out."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from training import launcher
from training.launcher import LaunchError, build_launch

from .helpers import REPO, tiny_config


def _resourceconfig(hosts, current, instance_type):
    return {
        "current_host": current,
        "current_instance_type": instance_type,
        "current_group_name": "homogeneousCluster",
        "hosts": hosts,
        "instance_groups": [{"instance_group_name": "homogeneousCluster", "instance_type": instance_type, "hosts": hosts}],
        "network_interface_name": "eth0",
    }


def _argdict(argv):
    return dict(arg[2:].split("=", 1) for arg in argv if arg.startswith("--") and "=" in arg)


def test_single_node_p6_b200():
    cfg = tiny_config()
    rc = _resourceconfig(["algo-1"], "algo-1", "ml.p6-b200.48xlarge")
    launch = build_launch(rc, cfg.to_hyperparameters(), {"SM_NUM_GPUS": "8", "PATH": "/usr/bin"})
    args = _argdict(launch.argv)
    assert launch.argv[0] == "torchrun"
    assert launch.argv[-2:] == ["--module", "training"]
    assert args == {
        "nnodes": "1",
        "node_rank": "0",
        "nproc_per_node": "8",
        "master_addr": "algo-1",
        "master_port": str(launcher.MASTER_PORT),
        "max_restarts": "0",
    }
    env = launch.env
    assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "100"
    assert env["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"
    assert env["FI_PROVIDER"] == "efa"
    assert env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env["TIERED_TRAINING_MODE"] == "train"
    assert env["PATH"] == "/usr/bin"  # the rest of the environment passes through
    assert "--probe" not in launch.argv


@pytest.mark.parametrize("current", ["algo-1", "algo-2", "algo-3", "algo-4"])
def test_four_node_p5(current):
    cfg = tiny_config(hardware__instance_type="ml.p5.48xlarge")
    hosts = ["algo-3", "algo-1", "algo-4", "algo-2"]  # order in the file is not the rank order
    rc = _resourceconfig(hosts, current, "ml.p5.48xlarge")
    launch = build_launch(rc, cfg.to_hyperparameters(), {})  # no SM_NUM_GPUS: the catalogue says 8
    args = _argdict(launch.argv)
    assert args["nnodes"] == "4"
    assert args["node_rank"] == str(int(current.split("-")[1]) - 1)
    assert args["master_addr"] == "algo-1"
    assert args["nproc_per_node"] == "8"
    assert launch.env["FI_PROVIDER"] == "efa"
    assert launch.env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert launch.env["NCCL_BUFFSIZE"] == "8388608"


def test_host_order_is_numeric():
    cfg = tiny_config()
    hosts = [f"algo-{i}" for i in range(1, 12)]
    launch = build_launch(_resourceconfig(hosts, "algo-10", "ml.p5.48xlarge"), cfg.to_hyperparameters(), {})
    assert _argdict(launch.argv)["node_rank"] == "9"


def test_environment_wins_and_probe_mode():
    cfg = tiny_config()
    rc = _resourceconfig(["algo-1"], "algo-1", "ml.p6-b200.48xlarge")
    environ = {"TIERED_TRAINING_MODE": "probe", "NCCL_DEBUG": "INFO", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "90"}
    launch = build_launch(rc, cfg.to_hyperparameters(), environ, extra_args=["--foo"])
    assert launch.argv[-4:] == ["training", "--probe", "--candidate=1", "--foo"]
    assert _argdict(launch.argv)["master_port"] == str(launcher.MASTER_PORT + 1)  # a port of its own per candidate
    assert launch.env["NCCL_DEBUG"] == "INFO"
    assert launch.env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "90"
    assert launch.mode == "probe"


def test_non_efa_instance_gets_no_efa_settings():
    cfg = tiny_config(hardware__instance_type="ml.g5.12xlarge")
    rc = _resourceconfig(["algo-1"], "algo-1", "ml.g5.12xlarge")
    launch = build_launch(rc, cfg.to_hyperparameters(), {"SM_NUM_GPUS": "8"})
    assert "FI_PROVIDER" not in launch.env and "NCCL_BUFFSIZE" not in launch.env


@pytest.mark.parametrize(
    "rc, message",
    [
        ({"hosts": ["algo-1"]}, "current_host"),
        ({"current_host": "algo-1", "hosts": []}, "'hosts' must be"),
        ({"current_host": "algo-9", "hosts": ["algo-1"]}, "not in hosts"),
    ],
)
def test_bad_resourceconfig(rc, message):
    with pytest.raises(LaunchError, match=message):
        build_launch(rc, tiny_config().to_hyperparameters(), {"SM_NUM_GPUS": "1"})


def test_bad_mode_and_hyperparameters():
    rc = _resourceconfig(["algo-1"], "algo-1", "ml.p5.48xlarge")
    with pytest.raises(LaunchError, match="TIERED_TRAINING_MODE"):
        build_launch(rc, tiny_config().to_hyperparameters(), {"TIERED_TRAINING_MODE": "bench"})
    with pytest.raises(LaunchError, match="not a valid RunConfig"):
        build_launch(rc, {"recipe_name": '"x"'}, {})


def _run_main(config_dir, *args, **env):
    environ = {**os.environ, "TIERED_TRAINING_CONFIG_DIR": str(config_dir), **env}
    return subprocess.run(
        [sys.executable, "-m", "training.launcher", *args], cwd=REPO, env=environ, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "resourceconfig.json not found"),
        ("{not json", "resourceconfig.json at .* is not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
    ],
)
def test_main_missing_or_malformed_resourceconfig(tmp_path, content, expected):
    (tmp_path / "hyperparameters.json").write_text(json.dumps(tiny_config().to_hyperparameters()))
    if content is not None:
        (tmp_path / "resourceconfig.json").write_text(content)
    result = _run_main(tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("launcher: error: ")
    import re

    assert re.search(expected, lines[0])
    assert "Traceback" not in result.stderr


def test_main_execs_torchrun(tmp_path):
    """main() execs whatever ``torchrun`` is first on PATH: a stub that records its argv and env."""
    (tmp_path / "hyperparameters.json").write_text(json.dumps(tiny_config().to_hyperparameters()))
    (tmp_path / "resourceconfig.json").write_text(
        json.dumps(_resourceconfig(["algo-1", "algo-2"], "algo-2", "ml.p6-b200.48xlarge"))
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "torchrun"
    stub.write_text('#!/bin/sh\necho "ARGS $*"\necho "SHUTDOWN $TORCH_ELASTIC_SHUTDOWN_TIMEOUT MODE $TIERED_TRAINING_MODE"\n')
    stub.chmod(0o755)
    # SageMaker starts the container as `docker run <image> train`: that `train` is dropped.
    result = _run_main(tmp_path, "train", PATH=f"{bin_dir}:{os.environ['PATH']}", TIERED_TRAINING_MODE="probe", SM_NUM_GPUS="8")
    assert result.returncode == 0, result.stderr
    assert "ARGS --nnodes=2 --node_rank=1 --nproc_per_node=8 --master_addr=algo-1" in result.stdout
    assert "--module training --probe --candidate=1\n" in result.stdout
    assert "SHUTDOWN 100 MODE probe" in result.stdout


def test_a_launch_with_nothing_to_resume_does_not_import_torch(tmp_path):
    """The launcher is each host's entry point: torch (seconds of CPU per start) is the workers' business,
    and the launcher's own checkpoint check needs it only when a checkpoint is there to check."""
    (tmp_path / "checkpoints").mkdir()
    code = ("import sys; from pathlib import Path; from training import launcher; "
            f"launcher._check_world(None, 2, Path({str(tmp_path / 'checkpoints')!r})); "
            "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.strip() == "False", proc.stderr[-2000:]


def test_a_resume_is_checked_from_the_manifest_without_importing_torch(tmp_path):
    """A resumed job's hosts each start the launcher: its world-size check reads the newest committed
    checkpoint's manifest (its step, its world, its files by size), not DCP's ``.metadata`` (a torch
    pickle, here not even one), so no host pays for importing torch before torchrun starts."""
    step = tmp_path / "checkpoints" / "step-5"
    step.mkdir(parents=True)
    (step / ".metadata").write_bytes(b"not a pickle")
    (step / "__0_0.distcp").write_bytes(b"1234")
    manifest = {"step": 5, "world_size": 2, "files": {".metadata": {"bytes": 12}, "__0_0.distcp": {"bytes": 4}}}
    (step / "COMMITTED").write_text(json.dumps(manifest))
    config = tmp_path / "config.json"
    config.write_text(tiny_config().model_dump_json())
    code = ("import sys; from pathlib import Path; from tiered_training.contract.runconfig import RunConfig; from training import launcher\n"
            f"cfg = RunConfig.model_validate_json(Path({str(config)!r}).read_text())\n"
            f"launcher._check_world(cfg, 1, Path({str(step.parent)!r}))  # 2 -> 1 GPU keeps the global batch\n"
            f"try:\n    launcher._check_world(cfg, 3, Path({str(step.parent)!r}))\n"
            "except launcher.LaunchError as error:\n    print('refused:', error)\n"
            "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    lines = proc.stdout.strip().splitlines() or [proc.stderr[-2000:]]
    assert lines[-1] == "False", proc.stdout + proc.stderr[-2000:]
    assert lines[0].startswith("refused: cannot resume the checkpoint of a run on 2 GPUs on 3 GPUs"), proc.stdout
    (step / "__0_0.distcp").write_bytes(b"12")  # a truncated file: the newest checkpoint is not resumable
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.strip().splitlines() == ["False"], proc.stdout + proc.stderr[-2000:]


# -- probe candidates: each its own launch and port; train checks the candidate it will run -------------------

_BIGGER = {"parallel": {"sharding": "full", "shard_group_size": 1}, "micro_batch_size": 4, "grad_accum_steps": 1,
           "precision": {"precision": "fp32", "activation_checkpointing": "none", "loss_chunk_tokens": 64}}


def _eight_gpu_plan(**run):
    # candidate 1 (micro-batch 2) keeps 512 tokens a step whole on 8 GPUs; candidate 2 (micro-batch 4) does not
    return tiny_config(batch__global_batch_tokens=512, probe={"steps": 2, "alternatives": [_BIGGER]},
                       run={"id": "run-1", **run})


def test_probe_candidate_launch_has_its_own_port_and_layout():
    rc = _resourceconfig(["algo-1"], "algo-1", "ml.p6-b200.48xlarge")
    environ = {"TIERED_TRAINING_MODE": "probe", "SM_NUM_GPUS": "8", "TIERED_TRAINING_MASTER_PORT": "31000"}
    one = build_launch(rc, _eight_gpu_plan().to_hyperparameters(), environ, candidate=1)
    assert one.candidates == 2 and _argdict(one.argv)["master_port"] == "31001"
    with pytest.raises(LaunchError, match=r"InstanceCount 1 \(8 GPUs\) cannot run the plan"):
        build_launch(rc, _eight_gpu_plan().to_hyperparameters(), environ, candidate=2)  # checked on its own layout
    with pytest.raises(LaunchError, match="probe candidate 3 does not exist: the probe has 2"):
        build_launch(rc, _eight_gpu_plan().to_hyperparameters(), environ, candidate=3)


def test_train_checks_the_host_count_with_the_candidate_it_runs():
    rc = _resourceconfig(["algo-1"], "algo-1", "ml.p6-b200.48xlarge")
    build_launch(rc, _eight_gpu_plan(candidate=1).to_hyperparameters(), {"SM_NUM_GPUS": "8"})
    with pytest.raises(LaunchError, match="InstanceCount 1"):
        build_launch(rc, _eight_gpu_plan(candidate=2).to_hyperparameters(), {"SM_NUM_GPUS": "8"})


_PROBE_STUB = """#!/bin/sh
for a in "$@"; do
  if [ "$a" = training.health_check ]; then
    echo "HEALTH $*"
    if [ "$FAIL" = health ]; then
      echo "HealthCheckFailed: health check failed on 1 host(s): algo-1 GPU 0: 1.0 TFLOP/s matmul, below the 2.0 expected (x)" > "$TIERED_TRAINING_FAILURE_DIR/rank-0"; exit 1
    fi
    exit 0
  fi
done
for a in "$@"; do case $a in --candidate=*) n=${a#--candidate=};; esac; done
echo "PID $n $$"
if [ "$n" = "$FAIL" ] || [ "$FAIL" = all ]; then echo "ValueError: boom $n" > "$TIERED_TRAINING_FAILURE_DIR/rank-0"; exit 1; fi
mkdir -p "$TIERED_TRAINING_PROBE_DIR"
echo '{"candidate": '$n', "status": "ok", "tokens_per_second": '$n'00.0, "peak_allocated_bytes": 1000, "peak_reserved_bytes": 2000}' > "$TIERED_TRAINING_PROBE_DIR/candidate-$n.json"
"""


def _probe_with_stub(tmp_path, fail, cfg=None, gpus="1"):
    root = tmp_path / "opt/ml"
    (root / "input/config").mkdir(parents=True)
    cfg = cfg or tiny_config(probe={"steps": 2, "alternatives": [_BIGGER, _BIGGER]})
    (root / "input/config/hyperparameters.json").write_text(json.dumps(cfg.to_hyperparameters()))
    (root / "input/config/resourceconfig.json").write_text(json.dumps(_resourceconfig(["algo-1"], "algo-1", "cpu")))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(_PROBE_STUB)
    (bin_dir / "torchrun").chmod(0o755)
    result = _run_main(root / "input/config", PATH=f"{bin_dir}:{os.environ['PATH']}", TIERED_TRAINING_MODE="probe",
                       SM_NUM_GPUS=gpus, TIERED_TRAINING_OPT_ML=str(root), FAIL=fail)
    failure = root / "output/failure"
    return result, failure.read_text() if failure.exists() else None


def test_a_failed_candidate_is_recorded_and_the_others_still_run(tmp_path):
    result, failure = _probe_with_stub(tmp_path, fail="3")
    assert result.returncode == 0, result.stderr
    assert [line.split()[1] for line in result.stdout.splitlines() if line.startswith("PID ")] == ["1", "2", "3"]
    assert "PROBE best_candidate=2\n" in result.stdout and "PROBE tokens_per_second=200.00\n" in result.stdout
    assert "PROBE candidate=3" not in result.stdout  # a failed candidate prints no values
    assert "candidate 3, failed: algo-1 rank-0: ValueError: boom 3" in result.stdout
    assert failure is None
    health = [line for line in result.stdout.splitlines() if line.startswith("HEALTH ")]
    assert len(health) == 1 and "--probe" not in health[0] and "--candidate" not in health[0]
    assert result.stdout.index("HEALTH ") < result.stdout.index("PID 1")  # before the candidates


def test_a_failed_health_check_fails_the_probe_before_any_candidate(tmp_path):
    result, failure = _probe_with_stub(tmp_path, fail="health")
    assert result.returncode == 1
    assert "PID " not in result.stdout  # no candidate was launched
    assert failure.startswith("probe: algo-1 rank-0: HealthCheckFailed: health check failed on 1 host(s): algo-1 GPU 0: "
                              "1.0 TFLOP/s matmul"), failure


def test_a_probe_whose_every_candidate_failed_fails_the_job_naming_each(tmp_path):
    result, failure = _probe_with_stub(tmp_path, fail="all")
    assert result.returncode == 1
    assert "PROBE best_candidate=0\n" in result.stdout
    assert failure.startswith("probe: every candidate failed: candidate 1: algo-1 rank-0: ValueError: boom 1; "
                              "candidate 2: algo-1 rank-0: ValueError: boom 2; candidate 3: "), failure


def test_a_candidate_the_host_count_refuses_is_failed_without_a_launch(tmp_path):
    smaller = {**_BIGGER, "micro_batch_size": 2}  # 512 tokens a step stay whole on 8 GPUs at micro-batch 2, not 4
    cfg = tiny_config(batch__micro_batch_size=4, batch__global_batch_tokens=512, run={"id": "run-1"},
                      probe={"steps": 2, "alternatives": [smaller]})
    result, failure = _probe_with_stub(tmp_path, fail="none", cfg=cfg, gpus="8")
    assert result.returncode == 0, result.stderr
    assert [line.split()[1] for line in result.stdout.splitlines() if line.startswith("PID ")] == ["2"]
    assert "launcher: probe candidate 1 not launched: InstanceCount 1 (8 GPUs) cannot run the plan" in result.stdout
    assert "PROBE best_candidate=2\n" in result.stdout and failure is None


# -- a worker killed by a signal: named as such, ahead of its peers' errors ------------------------------------------

# torchrun's words when its worker with local rank 1 was SIGKILLed (torch 2.13; its peer then got SIGTERM)
TORCHRUN_SIGKILL = ("E1205 08:12:30.411000 7171 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
                    "(exitcode: -9) local_rank: 1 (pid: 7175) of binary: /usr/bin/python3\n")
PEER = "DistBackendError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:29500"


def test_a_sigkilled_worker_is_the_reason_ahead_of_its_peers_closed_connections(tmp_path):
    killed = launcher.signalled_worker(TORCHRUN_SIGKILL, node_rank=1, nproc_per_node=8)
    assert killed == ("rank 9 (local rank 1, pid 7175): the worker process was killed by SIGKILL (exit -9, 137 from a "
                      "shell), possibly the kernel's OOM killer: check the host's memory")
    (tmp_path / "rank-8").write_text(PEER + "\n")  # the peer on the same host recorded its consequence
    assert launcher.failure_reason(tmp_path, 1, "algo-2", killed) == f"algo-2 {killed}"
    assert launcher.failure_reason(tmp_path, 1, "algo-2") == f"algo-2 rank-8: {PEER}"  # what was said before


def test_a_worker_ended_by_sigterm_or_by_its_own_error_is_not_called_killed(tmp_path):
    assert launcher.signalled_worker(TORCHRUN_SIGKILL.replace("-9", "1"), 0, 2) is None  # it raised: it recorded why
    assert launcher.signalled_worker("step 9 | loss 2.1 | failed (exitcode", 0, 2) is None
    sigterm = launcher.signalled_worker(TORCHRUN_SIGKILL.replace("-9", "-15"), 0, 2)
    assert sigterm.endswith("killed by SIGTERM (exit -15, 143 from a shell)")  # a stop: no memory hint
    cause = "DataError: /opt/ml/input/data/train/shard-00007.bin: at token 912: token id 131072, outside the vocabulary"
    (tmp_path / "rank-0").write_text(cause + "\n")
    assert launcher.failure_reason(tmp_path, 1, "algo-1", sigterm) == f"algo-1 rank-0: {cause}"
    assert launcher.failure_reason(tmp_path / "none", -9, "algo-1") == (
        "algo-1: torchrun was killed by SIGKILL (exit -9, 137 from a shell): possibly the kernel's OOM killer: check "
        "the host's memory")


_KILLED_WORKER = """
import os, signal, sys
sys.path.insert(0, {repo!r})
import torch.distributed as dist
from training.__main__ import record_failure
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
try:
    dist.barrier()
    dist.barrier()
except BaseException as error:
    record_failure(error)
    raise
"""


@pytest.mark.torch
def test_the_failure_file_names_a_worker_that_sigkill_ended(tmp_path):
    """A real torchrun of two gloo workers; one is SIGKILLed, the other loses its peer: the failure file names the
    killed worker, and torchrun's own output still reaches the launcher's stderr."""
    (tmp_path / "worker.py").write_text(_KILLED_WORKER.format(repo=str(REPO)))
    code = (
        "import os, sys; from pathlib import Path; from training import launcher\n"
        "argv = ['torchrun', '--nnodes=1', '--node_rank=0', '--nproc_per_node=2', '--master_addr=127.0.0.1',\n"
        f"        '--master_port={_port()}', '--max_restarts=0', {str(tmp_path / 'worker.py')!r}]\n"
        "env = {**os.environ, 'SM_CURRENT_HOST': 'algo-1', 'OMP_NUM_THREADS': '1'}\n"
        "run = launcher.Launch(argv=argv, env=env, nnodes=1, node_rank=0, nproc_per_node=2, mode='train')\n"
        f"sys.exit(launcher.run_torchrun(run, Path({str(tmp_path / 'output')!r})))\n"
    )
    path = f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), "PATH": path})
    assert proc.returncode == 1, proc.stderr[-3000:]
    failure = (tmp_path / "output" / "failure").read_text()
    assert failure.startswith("algo-1 rank 1 (local rank 1, pid "), failure
    assert failure.endswith("): the worker process was killed by SIGKILL (exit -9, 137 from a shell), possibly the "
                            "kernel's OOM killer: check the host's memory\n"), failure
    assert "failed (exitcode: -9) local_rank: 1" in proc.stderr  # relayed


def _port() -> int:
    from tiered_training.contract.ports import loopback_port

    return loopback_port()
