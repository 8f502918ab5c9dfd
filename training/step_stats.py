"""What one optimiser step reports to the metrics hooks (every rank gets it; hooks decide who prints)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class StepStats:
    step: int  # 1-based: the number of optimiser steps done, this one included
    loss: float  # mean loss over the global batch of this step
    grad_norm: float  # total gradient norm before clipping
    lr: float  # learning rate used by this step
    tokens: int  # tokens in this step's global batch (all ranks)
    step_time_s: float  # wall time of the step, data wait included
    data_wait_s: float  # time this rank waited for the data loader
    tokens_per_second: float  # global tokens / step time
    micro_batch_size: int
    grad_accum_steps: int  # accumulation used by this step (ramps up if the plan asks)
    checkpoint_save_s: float | None = None  # blocking part of a checkpoint save started at this step
    peak_memory_bytes: int | None = None  # torch.cuda.max_memory_allocated() this step (CUDA only)
    peak_reserved_bytes: int | None = None  # torch.cuda.max_memory_reserved() this step (CUDA only)
    world_size: int = 1
    forward_backward_s: float = 0.0  # this rank's forward, backward and clipping (training.components.straggler)
    optimizer_s: float = 0.0  # this rank's update
    skipped: bool = (
        False  # non-finite loss or gradient norm on some rank: no update was applied, ``step`` did not advance
    )

    @property
    def tokens_per_second_per_device(self) -> float:
        return self.tokens_per_second / max(self.world_size, 1)

    def as_dict(self) -> dict:
        return asdict(self)

    def log_line(self) -> str:
        line = (
            f"step {self.step:>6} | loss {self.loss:.4f} | grad_norm {self.grad_norm:.3f} | lr {self.lr:.3e}"
            f" | tok/s {self.tokens_per_second:,.0f} | step {self.step_time_s * 1000:.0f} ms"
            f" (data {self.data_wait_s * 1000:.0f} ms) | mbs {self.micro_batch_size} x accum {self.grad_accum_steps}"
        )
        if self.skipped:
            line += " | SKIPPED (non-finite)"
        if self.checkpoint_save_s is not None:
            line += f" | ckpt {self.checkpoint_save_s:.2f} s"
        if self.peak_memory_bytes is not None:
            line += f" | peak {self.peak_memory_bytes / 2**30:.2f} GiB"
        return line
