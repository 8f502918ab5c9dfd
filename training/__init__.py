"""The training container's trainer: FSDP2, FP8, activation checkpointing, DCP checkpoints.

This package is the only place in the repo that imports torch. Importing
``training`` itself stays light; the public entry points are

- :func:`training.trainer.run` (``run(cfg, paths, hooks=(), max_steps=None) -> RunResult``),
- :class:`training.step_stats.StepStats`, handed to every hook on every rank,
- :class:`training.paths.Paths`, where data, checkpoints and the model live,
- ``python -m training`` under ``torchrun`` (see ``training/__main__.py``).
"""

import os as _os
import sys as _sys

# Packages carried to a machine whose image lacks them (training/tools/gpu_check.sh) go after
# site-packages, so that they never shadow the image's own (its torch above all).
for _path in _os.environ.get("TT_APPEND_SYSPATH", "").split(_os.pathsep):
    if _path and _path not in _sys.path:
        _sys.path.append(_path)
