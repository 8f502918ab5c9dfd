"""The container's launcher and trainer, with a NaN loss or a full disk injected on one rank.

    python tests/trainer/nonfinite_driver.py launch   # in an /opt/ml tree (TIERED_TRAINING_OPT_ML)

``launch`` runs the real launcher (``training.launcher``: torchrun, the failure file), with this
file as the worker instead of ``--module training``. A worker makes the loss of rank
``TT_TEST_NAN_RANK`` NaN on the optimiser-step attempts listed in ``TT_TEST_NAN_AT`` (1-based,
comma-separated; ``N-`` means from N on), without touching its gradients: only that rank sees
a non-finite value, so only the all-reduced flag can make the other ranks skip too. With
``TT_TEST_ENOSPC_STEP`` set, rank ``TT_TEST_ENOSPC_RANK``'s checkpoint writer finds the disk full
(``OSError(ENOSPC)`` from its file write) while writing ``step-<TT_TEST_ENOSPC_STEP>`` (with
``TT_TEST_ENOSPC_MARKER=1``: while rank 0 writes its ``COMMITTED`` marker). Then it runs
``training.__main__.main``, as the container does.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))


def _attempts(spec: str):
    single, start = set(), None
    for part in filter(None, spec.split(",")):
        if part.endswith("-"):
            start = int(part[:-1])
        else:
            single.add(int(part))
    return lambda n: n in single or (start is not None and n >= start)


def worker() -> int:
    import torch

    from training.models import decoder as model

    bad = _attempts(os.environ.get("TT_TEST_NAN_AT", ""))
    rank = int(os.environ.get("RANK", "0"))
    original = model.CausalLMLoss.forward
    calls = [0]

    def forward(self, *args, **kwargs):
        loss = original(self, *args, **kwargs)
        calls[0] += 1  # one micro-batch per step in this test
        if rank == int(os.environ.get("TT_TEST_NAN_RANK", "1")) and bad(calls[0]):
            return loss + torch.tensor(float("nan"), device=loss.device)  # a NaN value, finite gradients
        return loss

    model.CausalLMLoss.forward = forward
    full_at = os.environ.get("TT_TEST_ENOSPC_STEP")
    marker = os.environ.get("TT_TEST_ENOSPC_MARKER") == "1"
    if full_at and marker and rank == 0:
        import errno

        write_text = Path.write_text

        def full_marker(self, data, *args, **kwargs):
            if self.name == "COMMITTED.tmp" and self.parent.name == f"step-{full_at}":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
            return write_text(self, data, *args, **kwargs)

        Path.write_text = full_marker  # type: ignore[method-assign]
    elif full_at and not marker and rank == int(os.environ.get("TT_TEST_ENOSPC_RANK", "1")):
        import errno

        from torch.distributed.checkpoint import filesystem

        write_item = filesystem._write_item

        def full_disk(transforms, stream, *args, **kwargs):
            name = str(getattr(stream, "name", ""))
            if f"/step-{full_at}/" in name:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), name)
            return write_item(transforms, stream, *args, **kwargs)

        filesystem._write_item = full_disk
    from training.__main__ import main

    return main(sys.argv[1:])


def launch() -> int:
    from training import launcher

    root = Path(os.environ[launcher.OPT_ML_VARIABLE])
    paths_env, paths_args = launcher.opt_ml_paths(root)
    environ = {**paths_env, **os.environ}
    run = launcher.launch_from_files(root / "input/config", environ, paths_args, checkpoint_dir=root / "checkpoints")
    argv = list(run.argv)
    at = argv.index("--module")
    argv[at:at + 2] = [str(Path(__file__).resolve()), "worker"]
    return launcher.run_torchrun(dataclasses.replace(run, argv=argv), root / "output")


if __name__ == "__main__":
    role = sys.argv.pop(1)
    code = {"launch": launch, "worker": worker}[role]()
    if role == "worker":
        from training.distributed.dist import exit_process

        exit_process(code)  # as ``python -m training`` leaves after a clean run
    sys.exit(code)
