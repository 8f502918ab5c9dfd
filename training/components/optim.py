"""AdamW, the learning-rate schedule and gradient clipping (the batch ramp is BatchConfig.accum_steps_at)."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from tiered_training.contract.runconfig import OptimizerConfig


def build_optimizer(model: nn.Module, opt: OptimizerConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW over all parameters; weight decay on matrices only (not norms, biases).

    The fused kernel is used on CUDA; on the CPU the foreach path keeps results
    deterministic.
    """
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": opt.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    kwargs = {"fused": True} if device.type == "cuda" else {"foreach": True}
    return torch.optim.AdamW(groups, lr=opt.lr, betas=(opt.beta1, opt.beta2), eps=1e-8, **kwargs)


def lr_factor(step: int, opt: OptimizerConfig, total_steps: int) -> float:
    """Multiplier of the peak LR for the 0-based optimiser step ``step``.

    Linear warmup over ``warmup_steps`` to the peak, then cosine or linear decay to
    ``min_lr_ratio * lr`` at ``total_steps``, or constant.
    """
    if opt.warmup_steps and step < opt.warmup_steps:
        return (step + 1) / opt.warmup_steps
    if opt.schedule == "constant":
        return 1.0
    span = max(1, total_steps - opt.warmup_steps)
    progress = min(1.0, (step - opt.warmup_steps) / span)
    if opt.schedule == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        decay = 1.0 - progress
    return opt.min_lr_ratio + (1.0 - opt.min_lr_ratio) * decay


def build_scheduler(optimizer: torch.optim.Optimizer, opt: OptimizerConfig, total_steps: int) -> LambdaLR:
    return LambdaLR(optimizer, lambda step: lr_factor(step, opt, total_steps))


def resume_schedule(scheduler: LambdaLR) -> tuple[float, float]:
    """After a checkpoint's optimiser and scheduler state are loaded: set the learning rate of the step the run
    resumes at from this run's schedule; ``(the rate restored, the rate set)``.

    The loaded state carries the rate the checkpoint's own schedule computed for that step; a resume with another
    ``total_steps`` (MaxSteps changed) would run its first step on it. The schedule is a function of the step, the
    warmup and the total, so the rebuilt one is what a run planned with the new total does from this step on:
    warmup done stays done, the decay is the new total's.
    """
    step = scheduler.last_epoch
    rates = [base * factor(step) for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
    restored = float(scheduler.optimizer.param_groups[0]["lr"])
    for group, rate in zip(scheduler.optimizer.param_groups, rates, strict=True):
        group["lr"] = rate
    scheduler._last_lr = list(rates)  # what get_last_lr() reports (LambdaLR keeps it so)
    return restored, float(rates[0])


def clip_grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Total norm over all (sharded) gradients, clipped to ``max_norm`` if it is positive."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"), foreach=True)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return norm
