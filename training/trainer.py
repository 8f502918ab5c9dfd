"""The training loop: build, shard, resume, train, checkpoint, export.

Public API::

    from training.trainer import run
    result = run(cfg, paths, hooks=[my_hook], max_steps=None)

``hooks`` are callables receiving a :class:`~training.step_stats.StepStats` after every
optimiser step, on every rank. ``torch.OutOfMemoryError`` propagates unchanged (a probe
catches it). On SIGTERM the trainer finishes the current step, saves, waits for the save
and returns with ``RunResult.stopped == True``.

Non-finite steps: when the loss or the gradient norm of a step is NaN or infinite on any
rank (one all-reduced flag, so every rank decides alike), the update is skipped: no
optimiser step, no LR-schedule step, no step count, no checkpoint of that step. Its batch
is consumed: the data position moves past it, as Megatron-LM does for a skipped iteration
(its LR scheduler steps only when the update succeeded:
https://github.com/NVIDIA/Megatron-LM/blob/main/megatron/training/training.py); replaying
the same batch would most likely fail the same way. The step is reported to the hooks
with ``skipped=True`` (the NonFiniteLoss metric counts it) and logged. More than
``optimizer.max_nonfinite_skips`` skips in a row raise :class:`NonFiniteError` after the
save in flight (a healthy state) is committed, so the last healthy checkpoint is never
pruned by a checkpoint of a broken state.

The loop (``_loop``) orchestrates: :func:`train_step` does one optimiser step (forward, backward,
clipping, the all-reduced non-finite check, the update or its skip); :class:`SaveStopPolicy` votes
across ranks, after every step, on stopping and saving, and counts the non-finite steps in a row.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from tiered_training.contract.metrics import FINAL_TRAIN_LOSS
from tiered_training.contract.runconfig import RunConfig
from tiered_training.contract.world import accumulation, resume_accumulation
from training.components import float8
from training.components.ac import apply_ac
from training.components.checkpoint import CheckpointManager
from training.components.compile import apply_compile
from training.components.data import build_dataloader, build_sft_dataloader, split_batch
from training.components.fence import from_environment as lease_fence
from training.components.fence import writer_of
from training.components.identity import identity as run_identity
from training.components.identity import same_run
from training.components.loss import valid_tokens
from training.components.optim import build_optimizer, build_scheduler, clip_grad_norm, resume_schedule
from training.components.packing import check_attention, split_sft_batch
from training.distributed.context_parallel import ContextParallel, apply_context_parallel
from training.distributed.dist import DistInfo, init_distributed, new_gloo_group
from training.distributed.parallel import apply_fsdp, build_mesh, enable_tf32, shard_group_size, sync_replicas
from training.export import export_hf, load_hf_weights, plain_tensor
from training.models.decoder import CausalLM, CausalLMLoss, build_model, materialize
from training.models.lora import apply_lora, export_adapter, has_lora, store_frozen_base
from training.models.nf4 import check_shardable, quantize_base
from training.paths import Paths
from training.step_stats import StepStats

log = logging.getLogger("training")

# Python's automatic garbage collection is off while training and a generation-1 collection runs
# every GC_EVERY_STEPS steps on every rank at once, as torchtitan does (its gc_freq default, 50):
# an automatic collection pauses one rank at a random point, and the others wait for it in the
# next collective (https://github.com/pytorch/torchtitan/blob/main/torchtitan/tools/utils.py).
GC_EVERY_STEPS = 50

Hook = Callable[[StepStats], None]


class NonFiniteError(RuntimeError):
    """More non-finite steps in a row than ``optimizer.max_nonfinite_skips`` allows."""


@dataclass
class RunResult:
    step: int  # optimiser steps done in total (resumed ones included)
    resumed_from: int | None  # the checkpoint step this run started from
    stopped: bool  # True when SIGTERM ended the run early (after saving)
    final_loss: float | None
    losses: dict[int, float] = field(default_factory=dict)  # step -> loss, for the steps this run did
    checkpoint_step: int | None = None  # last committed checkpoint
    skipped_steps: int = 0  # steps skipped for a non-finite loss or gradient norm
    exported_to: Path | None = None
    # the last value of each metric the run reports, by name (train:loss, validation:loss; a task's own, such as
    # trl's rewards/accuracies): the evaluation records them all and the model package the catalogue's
    final_metrics: dict[str, float] = field(default_factory=dict)
    evaluation: dict[str, Any] | None = None  # the export's evaluation report (training/evaluation.py), rank 0
    trainer: Trainer | None = field(
        default=None, repr=False
    )  # the built model and optimiser, for callers that inspect them


class _StopSignal:
    """Records SIGTERM; the loop stops at the next step boundary, on every rank together."""

    def __init__(self, deadline_s: float):
        self.received_at: float | None = None
        self.deadline_s = deadline_s
        self._previous: Callable[[int, FrameType | None], Any] | int | None = None
        self._timer: threading.Timer | None = None

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            self._previous = signal.signal(signal.SIGTERM, self._handle)

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
        if self._timer is not None:
            self._timer.cancel()

    def _handle(self, signum, frame) -> None:
        if self.received_at is None:
            self.received_at = time.monotonic()
            log.warning("SIGTERM received: finishing the current step, then saving (deadline %d s)", self.deadline_s)
            self._timer = threading.Timer(self.deadline_s, self._late)
            self._timer.daemon = True
            self._timer.start()

    def _late(self) -> None:
        log.error(
            "the shutdown deadline of %d s has passed and the final save is not done; "
            "the newest committed checkpoint will be used on restart",
            self.deadline_s,
        )


@dataclass(frozen=True)
class StepVote:
    """What every rank does after a step, decided together (:meth:`SaveStopPolicy.vote`)."""

    stopping: bool  # SIGTERM reached some rank: save, wait for the save, return
    out_of_time: bool  # the segment's time ran out before the run's last step: save, wait, hand over
    final: bool  # the run's or the segment's last step, or out of time: wait for the save
    save: bool  # save the state after this step now


class SaveStopPolicy:
    """When to save and when to stop, decided alike on every rank, and how many non-finite steps in a row pass.

    ``stopped_before_start`` (once) and ``vote`` (after every step) are each one small all-reduce on ``group``:
    every rank calls them at the same points. The clocks of the checkpoint interval and of the segment's time
    limit start when the policy is made."""

    def __init__(self, cfg: RunConfig, stop: _StopSignal, group, *, saved_at: int | None, save_checkpoints: bool):
        self.cfg, self.stop, self.group = cfg, stop, group
        self.save_checkpoints = save_checkpoints
        self.max_skips = cfg.optimizer.max_nonfinite_skips
        self.segment_end = cfg.run.end_step(cfg.batch.total_steps)
        self.interval_s = cfg.checkpoint.interval_minutes * 60.0
        self.loop_started = time.monotonic()
        self.last_save = time.monotonic()
        self.saved_at = saved_at  # the step whose state the newest save holds
        self.in_a_row = 0  # non-finite steps in a row

    def stopped_before_start(self) -> bool:
        """Whether SIGTERM reached any rank before the first step."""
        early = torch.tensor([1 if self.stop.received_at is not None else 0])
        dist.all_reduce(early, op=dist.ReduceOp.MAX, group=self.group)
        return bool(early.item())

    def count(self, skipped: bool) -> bool:
        """Count a step as skipped (non-finite) or applied; True when it is one skip in a row too many."""
        self.in_a_row = self.in_a_row + 1 if skipped else 0
        return skipped and self.in_a_row > self.max_skips

    def vote(self, step: int, skipped: bool) -> StepVote:
        """Whether to stop or save after ``step`` (the steps done so far): one small all-reduce decides, for all
        ranks together."""
        cfg = self.cfg
        total_steps = cfg.batch.total_steps
        flags = torch.tensor(
            [
                1 if self.stop.received_at is not None else 0,
                1 if self.interval_s > 0 and time.monotonic() - self.last_save >= self.interval_s else 0,
                1
                if cfg.run.segment_seconds > 0 and time.monotonic() - self.loop_started >= cfg.run.segment_seconds
                else 0,
            ]
        )
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
        stopping = bool(flags[0])
        out_of_time = bool(flags[2]) and step < total_steps
        due = bool(flags[1]) or (cfg.checkpoint.interval_steps > 0 and step % cfg.checkpoint.interval_steps == 0)
        due = due and not skipped  # a skipped step changed no state: nothing new to save
        final = (step >= total_steps or step >= self.segment_end) and not skipped or out_of_time
        save = self.save_checkpoints and (due or final or stopping) and step != self.saved_at
        return StepVote(stopping=stopping, out_of_time=out_of_time, final=final, save=save)

    def log_skipped(self, step: int, done: StepOutcome, skipped_steps: int) -> None:
        log.warning(
            "non-finite loss %s or gradient norm %s on some rank after step %d: update skipped "
            "(%d in a row, %d in this run; at most %d in a row)",
            done.loss,
            done.grad_norm,
            step,
            self.in_a_row,
            skipped_steps,
            self.max_skips,
        )

    def too_many_skips(self, step: int, done: StepOutcome, last_healthy: str) -> NonFiniteError:
        """The error that ends the run when ``count`` says so (raised after the save in flight is committed)."""
        return NonFiniteError(
            f"{self.in_a_row} steps in a row after step {step} had a non-finite loss or gradient norm "
            f"(last: loss {done.loss}, grad norm {done.grad_norm}; optimizer.max_nonfinite_skips is "
            f"{self.max_skips}); no update was applied; {last_healthy}; "
            "lower optimizer.lr or raise optimizer.warmup_tokens, or check the data after that position"
        )

    def saved(self, step: int) -> None:
        """A save of the state after ``step`` started: the checkpoint interval starts again."""
        self.last_save = time.monotonic()
        self.saved_at = step

    def log_stopped(self, step: int) -> None:
        elapsed = time.monotonic() - self.stop.received_at if self.stop.received_at is not None else 0.0
        deadline = self.cfg.checkpoint.shutdown_deadline_seconds
        log.warning(
            "stopped by SIGTERM after step %d; checkpoint saved %.1f s after the signal (deadline %d s)",
            step,
            elapsed,
            deadline,
        )


@dataclass
class Trainer:
    """The built pieces of one run (also handy for tests)."""

    cfg: RunConfig
    info: DistInfo
    lm: CausalLM
    model: CausalLMLoss
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR  # build_scheduler's
    mesh: DeviceMesh
    float8_modules: list[str]
    cp: ContextParallel | None = None  # context parallelism: the data rank and how sequences are split
    init_dir: Path | None = None  # the starting checkpoint: its tokenizer and chat template go into the export
    slowdown: float = 1.0  # forward/backward at this fraction of its speed (a rehearsal's --slow-host)
    reference: Any = None  # DPO with dpo.reference precomputed: training.dpo_train.ReferenceTable
    dpo_metrics: Any = None  # DPO: the last step's metric sums (training.dpo_train)
    restored_metrics: dict[str, float] = field(default_factory=dict)  # the resumed checkpoint's final metrics


def setup_logging(rank: int) -> None:
    level = logging.INFO if rank == 0 else logging.WARNING
    root = logging.getLogger("training")
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(f"[rank{rank}] %(asctime)s %(name)s %(levelname)s: %(message)s"))
        root.addHandler(handler)
        root.propagate = False
    root.setLevel(level)


def build(
    cfg: RunConfig, paths: Paths | None = None, *, info: DistInfo | None = None, emulate_fp8: bool | None = None
) -> Trainer:
    """Model, sharding, precision, checkpointing and optimiser, as the RunConfig says."""
    info = info or init_distributed()
    precision = cfg.precision
    if emulate_fp8 is None:
        emulate_fp8 = info.device.type != "cuda"
    if precision.precision == "fp32":
        enable_tf32()
    float8.validate(precision, sharding=cfg.parallel.sharding, device=info.device, emulate=emulate_fp8)
    mesh = build_mesh(cfg.parallel, info.world_size, info.device.type)
    cp = ContextParallel.from_mesh(mesh, info.rank, info.world_size)
    init_dir = paths.init_checkpoint() if paths is not None else None
    lm = build_model(cfg.model, init_dir)
    lora = lora_config(cfg)
    if lora is not None:  # before FP8 and sharding: the frozen base is converted and sharded as usual
        apply_lora(lm, lora)
        if precision.precision != "fp32":  # mixed precision: the frozen base in bf16, as FSDP2 gathers it
            store_frozen_base(lm, torch.bfloat16)
        if cfg.sft is not None and cfg.sft.adapter == "qlora":  # the adapted projections' base in NF4
            if init_dir is None:
                raise ValueError(
                    "sft.adapter qlora quantises a trained base: model.init_checkpoint holds no config.json"
                )
            quantize_base(lm)
            check_shardable(lm, shard_group_size(mesh))
    converted = float8.apply_float8(
        lm, precision, sharding=cfg.parallel.sharding, device=info.device, emulate=emulate_fp8
    )
    layers = lm.model.layers
    apply_context_parallel(lm, cp)
    apply_ac(layers, precision.activation_checkpointing, preserve_rng_state=lora is not None and lora.dropout > 0)
    if precision.compile:
        apply_compile(layers)
    if cfg.sft is not None:
        check_attention(lm, cp.size)  # packed examples must not see each other
    if cfg.dpo is not None:  # preference pairs: the completions' log-probabilities (training/dpo_loss.py)
        from training.dpo_loss import PairLogps

        model: Any = PairLogps(lm, precision.loss_chunk_tokens)
    else:
        model = CausalLMLoss(lm, precision.loss_chunk_tokens, loss_group=cp.group)
    apply_fsdp(model, layers, mesh, precision)
    materialize(lm, info.device, seed=cfg.data.seed)
    if init_dir is not None:
        log.info("loading initial weights from %s", init_dir)
        load_hf_weights(lm, init_dir)
    optimizer = build_optimizer(model, cfg.optimizer, info.device)
    scheduler = build_scheduler(optimizer, cfg.optimizer, cfg.batch.total_steps)
    return Trainer(cfg, info, lm, model, optimizer, scheduler, mesh, converted, cp, init_dir)


def lora_config(cfg: RunConfig):
    """The LoRA settings when the run trains adapters (``sft.adapter: lora`` or ``qlora``), else None."""
    return cfg.sft.lora if cfg.sft is not None and cfg.sft.adapter != "none" else None


def _model_state_options(trainer: Trainer) -> StateDictOptions:
    """A LoRA run's checkpoints hold the adapters only: the frozen base is re-read from
    ``model.init_checkpoint`` at every start (``build``)."""
    frozen = has_lora(trainer.lm)
    return StateDictOptions(ignore_frozen_params=frozen, strict=not frozen)


def build_validator(cfg: RunConfig, paths: Paths, trainer: Trainer, group):
    """The validation loss of ``training.components.validation``, or None (none asked for, or no held-out data here)."""
    from training.components.validation import Validator

    assert trainer.cp is not None  # build sets it
    try:
        if cfg.dpo is not None:  # held-out pairs: the DPO loss and trl's metrics
            from training import dpo_train

            validator = dpo_train.build_validator(cfg, paths.data_dir, trainer, group)
        else:
            validator = Validator.build(
            cfg,
            paths.data_dir,
            trainer.model,
            trainer.info.device,
            rank=trainer.cp.data_rank,
            world_size=trainer.cp.data_ranks,
            group=group,
            shard=trainer.cp.shard,
        )
    except (FileNotFoundError, ValueError) as error:
        log.warning("no validation loss in this run: %s", error)
        validator = None
    if cfg.validation.source != "none" and dist.is_initialized():
        # every rank validates or none does: a pass is collective (a rank without held-out data
        # would leave the others waiting in its all-reduce)
        built = torch.tensor([0 if validator is None else 1])
        dist.all_reduce(built, op=dist.ReduceOp.MIN, group=group)
        if validator is not None and not built.item():
            log.warning("no validation loss in this run: another rank has no validation batch")
            validator = None
    return validator


def build_train_dataloader(cfg: RunConfig, paths: Paths, trainer: Trainer):
    """The training batches: token windows for pretraining; for SFT (``cfg.sft``) packed
    sequences as dicts of ``input_ids``, ``labels`` (-100 where masked) and ``position_ids``, from
    ``data.build_sft_dataloader``, which takes ``data.build_dataloader``'s arguments (with
    ``holdout_every``, the sequences validation reads are skipped, as for windows). The packed
    shards' manifest must name the RunConfig's ``data.token_dtype``: a mismatch is refused (DataError)."""
    batch, info = cfg.batch, trainer.info
    assert trainer.cp is not None  # build sets it
    common: dict[str, Any] = dict(
        rank=trainer.cp.data_rank,
        world_size=trainer.cp.data_ranks,  # the ranks of a CP group read the same data
        seed=cfg.data.seed,
        pin_memory=info.device.type == "cuda",
        num_workers=int(os.environ.get("TT_DATA_WORKERS", "0")),
        vocab_size=cfg.model.vocab_size,
        holdout_every=cfg.validation.holdout_every if cfg.validation.source == "holdout" else 0,
        data_uri=cfg.run.data_uri or None,  # errors name the shard by its S3 URI
    )
    if cfg.sft is not None:
        return build_sft_dataloader(
            paths.data_dir,
            cfg.data.token_dtype,
            batch.sequence_length,
            batch.micro_batch_size,
            with_index=cfg.dpo is not None,  # DPO looks its precomputed reference up by row
            **common,
        )
    return build_dataloader(
        paths.data_dir,
        cfg.data.token_dtype,
        batch.sequence_length,
        batch.micro_batch_size,
        mixture=cfg.data.mixture,
        **common,
    )


def micro_batch(trainer: Trainer, batch, device: torch.device) -> tuple:
    """``(inputs, labels, positions)`` of one micro-batch, this rank's part: an SFT batch dict as
    it comes (labels masked, positions per example); a pretraining window split and sharded for CP."""
    if isinstance(batch, dict):
        if trainer.cfg.dpo is not None:  # and the rows' indices: the precomputed reference is looked up by row
            return (*split_sft_batch(batch, device), batch["index"])
        return split_sft_batch(batch, device)
    assert trainer.cp is not None  # build sets it
    return trainer.cp.shard(*split_batch(batch, device))


def forward_backward(trainer: Trainer, micro_batches: list[tuple]) -> torch.Tensor:
    """Forward and backward of one optimiser step's micro-batches, ``(inputs, labels, positions)``
    each (this rank's part). Each micro-batch's loss sum is divided by the step's global count
    of valid labels and FSDP sums the gradients (``parallel.apply_fsdp``): the gradient is the
    token mean over the whole step, however the labels are masked. The gradients are
    reduce-scattered after each micro-batch and all-reduced across replicas after the last one
    only. Returns this rank's part of the step loss (the loss is its sum over ranks)."""
    model, device = trainer.model, trainer.info.device
    loss_sum = torch.zeros((), device=device, dtype=torch.float32)
    accum = len(micro_batches)
    count = valid_tokens(micro_batches, device)
    for index, (inputs, labels, positions) in enumerate(micro_batches):
        sync_replicas(model, trainer.mesh, last=index == accum - 1)
        loss = model(inputs, labels, positions, divisor=count)
        loss.backward()
        loss_sum += loss.detach()
    return loss_sum


@dataclass(frozen=True)
class StepOutcome:
    """What :func:`train_step` did: the step's global loss and gradient norm, and whether it was applied."""

    loss: float  # summed over ranks
    grad_norm: float
    lr: float  # the learning rate the step used
    skipped: bool  # non-finite loss or gradient norm on some rank: no update (see the module docstring)
    accum: int  # micro-batches
    data_wait_s: float  # time spent waiting for them
    forward_backward_s: float = 0.0  # forward, backward and clipping, to the step's one wait for the device
    optimizer_s: float = 0.0  # the update (as launched on a GPU)


def next_micro_batches(trainer: Trainer, data_iter, accum: int) -> tuple[list[tuple], float]:
    """``accum`` micro-batches from ``data_iter`` (this rank's part, on its device), and the seconds spent waiting
    for the data."""
    data_wait = 0.0
    micro_batches = []
    for _ in range(accum):
        waited = time.perf_counter()
        tokens = next(data_iter)
        data_wait += time.perf_counter() - waited
        micro_batches.append(micro_batch(trainer, tokens, trainer.info.device))
    return micro_batches, data_wait


def train_step(trainer: Trainer, data_iter, accum: int, group, *, precompute: bool) -> StepOutcome:
    """One optimiser step over ``accum`` micro-batches: forward, backward, gradient clipping, then the update, or
    no update when the loss or the gradient norm is non-finite on any rank. ``group``: the CPU group of the one
    all-reduce that sums the loss and counts those ranks. ``precompute``: FP8 scales recomputed after the update."""
    model, optimizer, scheduler = trainer.model, trainer.optimizer, trainer.scheduler
    micro_batches, data_wait = next_micro_batches(trainer, data_iter, accum)
    computed = time.perf_counter()
    if trainer.cfg.dpo is not None:
        from training import dpo_train

        loss_sum = dpo_train.forward_backward(trainer, micro_batches)
    else:
        loss_sum = forward_backward(trainer, micro_batches)
    grad_norm = clip_grad_norm(model, trainer.cfg.optimizer.grad_clip)
    lr = float(scheduler.get_last_lr()[0])  # a float already (AdamW's lr is the config's float)
    # The step's one wait for the GPU: this rank's loss and the gradient norm, copied together.
    # One CPU all-reduce then sums the loss over ranks and counts the ranks with a NaN or an
    # inf, so that a NaN on one rank skips the step on every rank. The optimiser step is queued
    # behind it, and the next step's batch is read while the GPU runs it.
    loss_local, grad_norm_value = torch.stack([loss_sum.detach().float(), grad_norm.detach().float()]).cpu().tolist()
    if trainer.slowdown < 1:  # a rehearsal's slowed host
        time.sleep((time.perf_counter() - computed) * (1 / trainer.slowdown - 1))
    forward_backward_s = time.perf_counter() - computed
    finite = math.isfinite(loss_local) and math.isfinite(grad_norm_value)
    reduced = torch.tensor([loss_local, 0.0 if finite else 1.0], dtype=torch.float64)
    dist.all_reduce(reduced, op=dist.ReduceOp.SUM, group=group)
    loss_value, bad_ranks = reduced.tolist()
    skipped = bad_ranks > 0
    updated = time.perf_counter()
    if skipped:  # no update, no schedule step; the batch is consumed
        optimizer.zero_grad(set_to_none=True)
    else:
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if precompute:
            float8.precompute_scales(model)
    return StepOutcome(
        loss=loss_value,
        grad_norm=grad_norm_value,
        lr=lr,
        skipped=skipped,
        accum=accum,
        data_wait_s=data_wait,
        forward_backward_s=forward_backward_s,
        optimizer_s=time.perf_counter() - updated,
    )


def _train_state(trainer: Trainer, step: int, dataloader, rank: int, final_metrics: dict | None = None) -> dict:
    """What a checkpoint holds. The data position is global (the same on every rank), so a
    checkpoint resumes on any number of ranks; only the RNG state is per rank. ``final_metrics``: the run's
    last value of each metric so far, so that a job that resumes at the end still reports them."""
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    # a model's state dict holds tensors (torch types it as any state dict)
    model_state: dict[str, Any] = get_model_state_dict(trainer.model, options=_model_state_options(trainer))
    return {
        # float8 weights as the plain tensors they wrap: DCP reads into (and writes from) their storage
        "model": {key: plain_tensor(value) for key, value in model_state.items()},
        "optimizer": get_optimizer_state_dict(trainer.model, trainer.optimizer),
        "train": pickle.dumps(
            {
                "step": step,
                "scheduler": trainer.scheduler.state_dict(),
                "total_steps": trainer.cfg.batch.total_steps,  # the schedule's total (MaxSteps may change on resume)
                "data": dataloader.state_dict(),
                "world_size": trainer.info.world_size,
                "final_metrics": dict(final_metrics or {}),
            }
        ),
        f"rng_rank{rank}": pickle.dumps(rng),
    }


def _finite_everywhere(weights: dict, group) -> bool:
    """Whether every weight about to be saved is finite on every rank (one all-reduced flag)."""
    found = []
    for value in weights.values():
        local = value.to_local() if isinstance(value, DTensor) else value
        if local.is_floating_point() and local.numel():
            found.append((~torch.isfinite(local)).any())
    flag = torch.tensor([1 if found and bool(torch.stack(found).any()) else 0])  # one device sync
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return not flag.item()


def _last_healthy(ckpt: CheckpointManager, saved_at: int | None) -> str:
    newest = ckpt.last_committed if ckpt.last_committed is not None else saved_at
    return (
        f"the newest checkpoint (step-{newest}) holds the last healthy state"
        if newest is not None
        else "no checkpoint was saved"
    )


def _restore(trainer: Trainer, state: dict, dataloader, rank: int) -> int:
    set_model_state_dict(trainer.model, state["model"], options=_model_state_options(trainer))
    set_optimizer_state_dict(trainer.model, trainer.optimizer, state["optimizer"])
    train = pickle.loads(state["train"])
    trainer.restored_metrics = dict(train.get("final_metrics") or {})  # none in a checkpoint saved before them
    trainer.scheduler.load_state_dict(train["scheduler"])
    _resume_schedule(trainer, train, rank)
    if "data" not in train:
        raise ValueError("the checkpoint stores per-rank data positions (an older format) and cannot be resumed")
    dataloader.load_state_dict(train["data"])
    if f"rng_rank{rank}" in state:
        rng = pickle.loads(state[f"rng_rank{rank}"])
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
    else:  # saved on another number of ranks: this rank had no state
        torch.manual_seed(trainer.cfg.data.seed + rank + int(train["step"]))
    if train.get("world_size", trainer.info.world_size) != trainer.info.world_size:
        log.warning(
            "resuming a checkpoint of %d ranks on %d: the state is resharded, the data continues from its "
            "global position, and the accumulation keeps the global batch",
            train["world_size"],
            trainer.info.world_size,
        )
    return int(train["step"])


def _resume_schedule(trainer: Trainer, train: dict, rank: int) -> None:
    """The learning rate from the step resumed on follows this run's schedule; a changed total is logged."""
    restored, rate = resume_schedule(trainer.scheduler)
    total, saved_total = trainer.cfg.batch.total_steps, train.get("total_steps")
    if rank == 0 and (saved_total not in (None, total) or not math.isclose(restored, rate, rel_tol=1e-9)):
        step = int(train["step"])
        log.info(
            "the learning-rate schedule is rebuilt for %d total steps (the checkpoint's: %s): step %d runs at %.3e "
            "(the checkpoint's schedule: %.3e), warmup %d steps",
            total,
            saved_total if saved_total is not None else "not recorded",
            step + 1,
            rate,
            restored,
            trainer.cfg.optimizer.warmup_steps,
        )


def _resume_accumulation(cfg: RunConfig, state: dict, world: int):
    """The accumulation that keeps the resumed run's global batch on this world (WorldSizeError if none)."""
    saved_world = pickle.loads(state["train"]).get("world_size", world)
    return resume_accumulation(cfg, saved_world, world)


def run(
    cfg: RunConfig,
    paths: Paths,
    *,
    hooks: Iterable[Hook] = (),
    max_steps: int | None = None,
    resume: bool = True,
    save_checkpoints: bool = True,
    export: bool | None = None,
    step_delay_s: float = 0.0,
    slowdown: float = 1.0,
) -> RunResult:
    """Train as ``cfg`` says; see the module docstring.

    max_steps: stop after this many optimiser steps in this call (a probe); such a run
        saves no final checkpoint and exports nothing unless it also reaches total_steps.
    export: write the HF model to ``paths.model_dir`` at the end (default: when total_steps is reached).
    step_delay_s: seconds added inside each timed step (a probe's TIERED_TRAINING_SLOW_CANDIDATE, rehearsals only).
    slowdown: this rank's forward/backward at this fraction of its speed (TIERED_TRAINING_SLOW_HOST, rehearsals only).
    """
    info = init_distributed()
    setup_logging(info.rank)
    hooks = list(hooks)
    stop = _StopSignal(cfg.checkpoint.shutdown_deadline_seconds)
    stop.install()  # before the (possibly long) build, so an early SIGTERM also ends cleanly
    gc_was_enabled = gc.isenabled()
    gc.disable()
    gc.collect(1)
    try:
        return _run(cfg, paths, info, stop, hooks, max_steps, resume, save_checkpoints, export, step_delay_s, slowdown)
    finally:
        stop.uninstall()
        if gc_was_enabled:
            gc.enable()


def _run(
    cfg, paths, info, stop, hooks, max_steps, resume, save_checkpoints, export, step_delay_s=0.0, slowdown=1.0
) -> RunResult:
    accum_at, exact = accumulation(cfg, info.world_size)
    if not exact and info.rank == 0:
        log.warning(
            "%d ranks cannot keep the plan's global batch of %d tokens; running the plan's accumulation as it is",
            info.world_size,
            cfg.batch.global_batch_tokens,
        )
    torch.manual_seed(cfg.data.seed + info.rank)
    trainer = build(cfg, paths, info=info)
    trainer.slowdown = slowdown
    dataloader = build_train_dataloader(cfg, paths, trainer)
    if cfg.sft is not None:
        # a probe (a few steps, no resume) precomputes the reference of the rows those steps read, not all
        reads = None
        if max_steps is not None and not resume:
            assert trainer.cp is not None  # build sets it
            reads = sum(accum_at(s) for s in range(max_steps)) * cfg.batch.micro_batch_size * trainer.cp.data_ranks
        _check_layout(cfg, trainer, paths, dataloader.dataset, reads)
    save_group, control_group = new_gloo_group(), new_gloo_group()
    identity = run_identity(cfg, paths.data_dir, info.world_size) if cfg.run.id else None
    ckpt = CheckpointManager(
        paths.checkpoint_dir,
        keep_last=cfg.checkpoint.keep_last,
        rank=info.rank,
        save_group=save_group,
        control_group=control_group,
        identity=identity,
        accept=same_run(identity) if identity else None,
        candidate=(cfg.run.candidate or 1, cfg.candidate_config(1).describe()),  # cfg runs its candidate as its own
        fence=lease_fence(os.environ) if info.rank == 0 else None,  # the run's lease, proven before every commit
        writer=writer_of(os.environ),
    )
    # On an exception (e.g. OutOfMemoryError) nothing here waits on other ranks: they may be
    # gone or stuck, and a collective would hang. A save still in flight is left to its thread;
    # without its COMMITTED marker a restart skips it.
    validator = build_validator(cfg, paths, trainer, control_group)
    resumed_from = None
    if resume:
        resumed_from, accum_at = _resume(trainer, dataloader, ckpt, accum_at)
    step = resumed_from if resumed_from is not None else 0
    end = _end_step(cfg, step, max_steps, info.is_main)
    result = RunResult(step=step, resumed_from=resumed_from, stopped=False, final_loss=None, trainer=trainer)
    result.final_metrics.update(trainer.restored_metrics)  # a resumed run's, until this job's steps replace them
    policy = SaveStopPolicy(cfg, stop, control_group, saved_at=resumed_from, save_checkpoints=save_checkpoints)
    if _loop(trainer, dataloader, ckpt, policy, hooks, validator, result, end, accum_at, step_delay_s):
        _finish(trainer, ckpt, result, paths.model_dir, export)
        if result.exported_to is not None and cfg.evaluation.enabled:
            _evaluate(trainer, result, paths, validator, control_group)
    for group in (save_group, control_group):  # nothing is in flight now; repeated runs (probes) don't pile up groups
        dist.destroy_process_group(group)
    return result


def _check_layout(cfg: RunConfig, trainer: Trainer, paths: Paths, dataset, reads: int | None) -> None:
    """DPO reads pairs and SFT examples, each refusing the other's shards; the precomputed reference is
    computed here, from the starting weights, before a resume restores the trained state (for the rows the
    first ``reads`` items of the stream hold, when given)."""
    from training import dpo_train

    manifest = dataset.manifest
    where = cfg.run.data_uri or str(paths.data_dir)
    if cfg.dpo is None:
        if manifest.get("layout") == "pairs":
            raise ValueError(f"{where}: preference pairs (python -m training.dpo_data); train them with task dpo")
        return
    dpo_train.check_pairs(manifest, where)
    if cfg.dpo.reference == "precomputed":
        rows = None if reads is None else dpo_train.rows_read(dataset, 0, reads)
        trainer.reference = dpo_train.precompute(trainer, paths.data_dir, rows)


def _resume(trainer: Trainer, dataloader, ckpt: CheckpointManager, accum_at):
    """Load the newest resumable checkpoint: ``(its step, the accumulation that keeps its global batch here)``,
    or ``(None, accum_at)`` when there is none."""
    cfg, info = trainer.cfg, trainer.info
    found = ckpt.resumable_step()
    if found is None:
        return None, accum_at
    state = _train_state(trainer, 0, dataloader, info.rank)
    saved = ckpt.saved_keys(found)
    state = {key: value for key, value in state.items() if key in saved}  # per-rank keys of another world
    ckpt.load(found, state)
    accum_at = _resume_accumulation(cfg, state, info.world_size)
    step = _restore(trainer, state, dataloader, info.rank)
    if step != found:  # the manifest said `found`; the state inside says otherwise
        raise ValueError(
            f"checkpoint step-{found} holds the training state of step {step}: "
            "its files were copied from another checkpoint; delete the directory"
        )
    log.info("resumed at step %d", step)
    return step, accum_at


def _end_step(cfg: RunConfig, step: int, max_steps: int | None, is_main: bool) -> int:
    """The step this call trains to: ``total_steps``, or fewer for ``max_steps`` or this segment's share."""
    batch = cfg.batch
    end = batch.total_steps if max_steps is None else min(batch.total_steps, step + max_steps)
    segment_end = cfg.run.end_step(batch.total_steps)  # a segment of a longer run trains its share, then hands over
    if segment_end < end:
        end = segment_end
        if is_main:
            log.info(
                "segment %d of %d: trains to step %d of %d, then saves for the next segment",
                cfg.run.segment,
                cfg.run.segments,
                segment_end,
                batch.total_steps,
            )
    return end


def _loop(
    trainer: Trainer,
    dataloader,
    ckpt: CheckpointManager,
    policy: SaveStopPolicy,
    hooks: list[Hook],
    validator,
    result: RunResult,
    end: int,
    accum_at: Callable[[int], int],
    step_delay_s: float = 0.0,
) -> bool:
    """Train from ``result.step`` to ``end``, recording into ``result``. True when ``end`` is reached; False when
    the run stops before it (SIGTERM, the segment's time limit)."""
    cfg, info = trainer.cfg, trainer.info
    device = info.device
    step = result.step
    data_iter = iter(dataloader)
    precompute = float8.needs_precompute(cfg.precision)
    if precompute:
        float8.precompute_scales(trainer.model)
    cuda = device.type == "cuda"

    if policy.stopped_before_start():
        log.warning("SIGTERM before the first step: nothing new to save, stopping")
        result.stopped = True
        return False

    while step < end:
        if step > 0 and step % GC_EVERY_STEPS == 0:
            gc.collect(1)
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        started = time.perf_counter()
        done = train_step(trainer, data_iter, accum_at(step), ckpt.control_group, precompute=precompute)
        if step_delay_s:
            time.sleep(step_delay_s)
        if done.skipped:
            result.skipped_steps += 1
        else:
            step += 1
            result.final_metrics[FINAL_TRAIN_LOSS] = done.loss  # before the save: its checkpoint carries it
        give_up = policy.count(done.skipped)
        step_time = time.perf_counter() - started

        vote = policy.vote(step, done.skipped)
        save_s = _checkpoint(trainer, dataloader, ckpt, policy, vote, step, result)

        stats = _step_stats(trainer, step, done, step_time, save_s)
        if not done.skipped:
            result.losses[step] = done.loss
            result.final_loss = done.loss
        result.step = step
        if cfg.dpo is not None:  # trl's metrics, means over the step's pairs (a collective: every rank)
            from training.dpo_train import step_metrics

            preference = step_metrics(trainer, ckpt.control_group)
            result.final_metrics.update({f"train:{name}": value for name, value in preference.items()})
            if info.is_main:
                log.info("step %d %s", step, " ".join(f"{k}={v:.4f}" for k, v in preference.items()))
                for hook in hooks:
                    if hasattr(hook, "record_preference"):
                        hook.record_preference(step, preference)
        if info.is_main:
            log.info(stats.log_line())
            if done.skipped:
                policy.log_skipped(step, done, result.skipped_steps)
        if info.is_main and cfg.data.mixture and cfg.sft is None:
            tokens = dataloader.dataset.tokens_seen()
            for hook in hooks:
                if hasattr(hook, "record_sources"):
                    hook.record_sources(tokens)
        for hook in hooks:
            hook(stats)
        if give_up:
            _wait_for_save(ckpt, result)  # the save in flight holds a healthy state: commit it
            raise policy.too_many_skips(step, done, _last_healthy(ckpt, policy.saved_at))
        if validator is not None and not vote.stopping and not done.skipped:
            validator.maybe_run(lambda loss: _record_validation(hooks, validator, loss, result))

        if vote.out_of_time and not vote.stopping:
            _segment_out_of_time(cfg, step, result.checkpoint_step)
            return False
        if vote.stopping:
            policy.log_stopped(step)
            result.stopped = True
            return False
    return True


def _record_validation(hooks: list[Hook], validator, loss: float, result: RunResult | None = None) -> None:
    """The pass's loss to the hooks, with a mixture's loss per source."""
    if result is not None:
        result.final_metrics["validation:loss"] = loss
        # DPO: trl's metrics on the held-out pairs (preference accuracy among them), for the evaluation and package
        held_out = getattr(validator, "metrics", None) or {}
        result.final_metrics.update({f"validation:{name}": value for name, value in held_out.items()})
    by_source = {"by_source": validator.source_losses} if validator.source_losses else {}
    for hook in hooks:
        if hasattr(hook, "record_validation"):
            hook.record_validation(loss, **by_source)


def _checkpoint(
    trainer: Trainer,
    dataloader,
    ckpt: CheckpointManager,
    policy: SaveStopPolicy,
    vote: StepVote,
    step: int,
    result: RunResult,
) -> float | None:
    """The checkpoints after ``step``, as ``vote`` says: a finished save committed, the state saved (its weights
    checked finite on every rank first), the save waited for when stopping or at the end. Returns the seconds the
    save blocked training, or None without a save."""
    save_s = None
    committed = ckpt.poll()
    if vote.save:
        state = _train_state(trainer, step, dataloader, trainer.info.rank, result.final_metrics)
        if not _finite_everywhere(state["model"], ckpt.control_group):  # never saved, so never kept
            ckpt.wait()
            raise NonFiniteError(
                f"the weights after step {step} are not finite although its loss and gradient "
                f"norm were; they were not saved; {_last_healthy(ckpt, policy.saved_at)}"
            )
        save_s = ckpt.save(step, state, tokens_seen=_tokens_seen(trainer.cfg, step))
        policy.saved(step)
    if vote.stopping or vote.final:
        committed = ckpt.wait() or committed
    if committed is not None:
        result.checkpoint_step = committed
    return save_s


def _wait_for_save(ckpt: CheckpointManager, result: RunResult) -> None:
    """Wait for the save in flight and commit it."""
    committed = ckpt.wait()
    if committed is not None:
        result.checkpoint_step = committed


def _step_stats(trainer: Trainer, step: int, done: StepOutcome, step_time: float, save_s: float | None) -> StepStats:
    """What the hooks receive after a step (this rank's peak memory; the other values are global)."""
    batch, info = trainer.cfg.batch, trainer.info
    cuda = info.device.type == "cuda"
    assert trainer.cp is not None  # build sets it
    tokens_global = done.accum * batch.micro_batch_size * batch.sequence_length * trainer.cp.data_ranks
    return StepStats(
        step=step,
        loss=done.loss,
        grad_norm=done.grad_norm,
        lr=done.lr,
        tokens=tokens_global,
        step_time_s=step_time,
        data_wait_s=done.data_wait_s,
        forward_backward_s=done.forward_backward_s,
        optimizer_s=done.optimizer_s,
        tokens_per_second=tokens_global / step_time,
        micro_batch_size=batch.micro_batch_size,
        grad_accum_steps=done.accum,
        checkpoint_save_s=save_s,
        peak_memory_bytes=torch.cuda.max_memory_allocated(info.device) if cuda else None,
        peak_reserved_bytes=torch.cuda.max_memory_reserved(info.device) if cuda else None,
        world_size=info.world_size,
        skipped=done.skipped,
    )


def _finish(trainer: Trainer, ckpt: CheckpointManager, result: RunResult, model_dir: Path, export: bool | None) -> None:
    """After the last step: commit the save in flight, then export (by default when ``total_steps`` is reached)."""
    cfg = trainer.cfg
    if ckpt.in_flight is not None:
        _wait_for_save(ckpt, result)
    if export if export is not None else result.step >= cfg.batch.total_steps:
        ckpt.prove(f"the export to {model_dir}")
        started = time.perf_counter()
        result.exported_to = export_model(trainer, model_dir)
        log.info(
            "exported %s to %s in %.1f s",
            "the LoRA adapter" if cfg.export.format == "adapter" else "Hugging Face weights",
            model_dir,
            time.perf_counter() - started,
        )


def _evaluate(trainer: Trainer, result: RunResult, paths: Paths, validator, group) -> None:
    """Rank 0 evaluates the export (``training/evaluation.py``) on its held-out batches and writes
    ``evaluation.json`` next to the export and at the top of the checkpoint directory (the run's prefix in S3);
    the other ranks wait for it."""
    if trainer.info.is_main:
        from training.components.identity import data_files, data_fingerprint, sft_fingerprint
        from training.evaluation import evaluate_export, print_final_metrics, write_evaluation

        cfg = trainer.cfg
        files = data_files(paths.data_dir)
        data: dict[str, Any] = {"uri": cfg.run.data_uri, "fingerprint": data_fingerprint(paths.data_dir, files)}
        data["files"] = files
        if cfg.sft is not None:
            data["sft_fingerprint"] = sft_fingerprint(paths.data_dir)
        assert result.exported_to is not None
        report = evaluate_export(
            cfg,
            result.exported_to,
            held_out=_held_out(cfg, paths, validator),
            final=dict(result.final_metrics),
            data=data,
            init_dir=trainer.init_dir,
            device=trainer.info.device,
        )
        places = [result.exported_to] + ([paths.checkpoint_dir] if cfg.run.id else [])
        written = write_evaluation(report, places)
        result.evaluation = report
        log.info("evaluated the export: %s (%s)", report.get("held_out") or report.get("error"), written[0])
        print_final_metrics(report)
    if dist.is_initialized():
        dist.barrier(group=group)


def _held_out(cfg: RunConfig, paths: Paths, validator) -> list | None:
    """The held-out batches the export is scored on: the first ``evaluation.batches`` of all the held-out data
    (as one rank reads it), whether or not every rank had some for the validation loss; None without any."""
    from training.components.validation import Validator

    if cfg.validation.source == "none":
        return None
    try:
        whole = Validator(cfg, paths.data_dir, torch.nn.Identity(), torch.device("cpu"), rank=0, world_size=1)
    except (FileNotFoundError, ValueError) as error:
        log.warning("no held-out data to evaluate the export on: %s", error)
        return list(validator.batches[: cfg.evaluation.batches]) if validator is not None else None
    return list(whole.batches[: cfg.evaluation.batches])


def export_model(trainer: Trainer, model_dir: Path) -> Path:
    """The model as ``export.format`` says: merged weights (adapters added in) in Hugging Face format, with the
    starting checkpoint's tokenizer, chat template and generation config; or the adapter alone in peft's format,
    its base named by Hugging Face id (``model.hf_id``; the init checkpoint's URI when there is none); collective."""
    cfg = trainer.cfg
    if cfg.export.format == "adapter":
        from training.export import hf_state_dict

        return export_adapter(
            trainer.lm,
            hf_state_dict(trainer.lm),
            lora_config(cfg),
            model_dir,
            base_model=cfg.model.hf_id or cfg.model.init_checkpoint,
        )
    return export_hf(
        trainer.lm,
        model_dir,
        dtype=_export_dtype(cfg),
        max_shard_bytes=cfg.export.max_shard_bytes,
        init_dir=trainer.init_dir,
    )


def _tokens_seen(cfg: RunConfig, step: int) -> int:
    """Tokens trained on in ``step`` steps: the plan's global batch at each step, the ramp's smaller ones included."""
    batch = cfg.batch
    per_accum = batch.global_batch_tokens // batch.grad_accum_steps  # one micro-batch on every data-parallel rank
    ramp = min(step, max(batch.ramp_steps, 0))
    return (sum(batch.accum_steps_at(s) for s in range(ramp)) + (step - ramp) * batch.grad_accum_steps) * per_accum


def _segment_out_of_time(cfg: RunConfig, step: int, committed: int | None) -> None:
    """The segment's time ran out before its share of the steps: the next segment resumes from the checkpoint
    just saved; in the last segment the run is unfinished, and the job fails saying how to resume it."""
    run = cfg.run
    message = (
        f"segment {run.segment} of {run.segments} of run {run.id!r} reached its time limit of "
        f"{run.segment_seconds:.0f} s at step {step} of {cfg.batch.total_steps} (checkpoint step-{committed})"
    )
    if run.segment < run.segments:
        log.warning("%s; the next segment resumes from it", message)
        return
    raise RuntimeError(
        f"{message}: the run is unfinished; resume it with RunId={run.id} "
        f"(`tiered-training start RECIPE --resume {run.id}`)"
    )


def _export_dtype(cfg: RunConfig) -> torch.dtype:
    return {"bf16": torch.bfloat16, "fp32": torch.float32}[cfg.export.dtype]
