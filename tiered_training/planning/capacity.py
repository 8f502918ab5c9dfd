"""The largest model that LoRA and QLoRA fine-tune on one node of each instance type, by the planner's memory model.

A model fits when the leanest setting the planner could choose on one node (bf16, full activation checkpointing,
one sequence per micro-batch, the state sharded over the node's GPUs, the default adapters) stays under its
tier's memory headroom (``memory.estimate``). Two figures per instance type and adapter:

- the largest catalogue model that fits;
- the largest model of a catalogue model's shape, made deeper (more decoder layers) until one more layer would not
  fit: the most parameters that fit at any catalogue width (a capacity figure: such a model need not exist).
"""

from __future__ import annotations

from dataclasses import dataclass

from tiered_training.catalog import Instance, instances, models, tier_for
from tiered_training.contract.architecture import Architecture, Lora
from tiered_training.planning.memory import estimate

ADAPTERS = ("lora", "qlora")
# The recipe's default adapters (recipe LoraSection): rank 16 on all seven projections, with dropout.
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MAX_LAYERS = 4096  # a search bound, past any model a node of today's instance types fits


@dataclass(frozen=True)
class Largest:
    instance: str
    adapter: str  # lora or qlora
    model: str | None  # the largest catalogue model that fits, or None
    model_parameters: int
    shape: str  # the catalogue model whose width gives the most parameters when made deeper
    layers: int
    parameters: int  # of that shape at ``layers``


def adapters(adapter: str, rank: int = 16, targets: tuple[str, ...] = DEFAULT_TARGETS) -> Lora:
    return Lora(rank, targets, dropout=True, quantized=adapter == "qlora")


def fits(arch: Architecture, instance: Instance, lora: Lora, sequence_length: int) -> bool:
    """Whether ``arch`` fine-tunes with ``lora`` on one node of ``instance`` at the leanest setting."""
    tier, _ = tier_for(arch.parameters)
    breakdown = estimate(
        arch,
        precision="bf16",
        checkpointing="full",
        sequence_length=sequence_length,
        micro_batch=1,
        shard_group=instance.gpus,
        hbm_bytes=instance.hbm_bytes,
        lora=lora,
        document_mask=True,
    )
    return breakdown.fraction <= tier.memory_headroom


def _deepest(arch: Architecture, instance: Instance, lora: Lora, sequence_length: int) -> int:
    """The most decoder layers of ``arch``'s width that fit (0: not even one)."""
    low, high = 0, MAX_LAYERS
    while low < high:
        mid = (low + high + 1) // 2
        if fits(arch.model_copy(update={"layers": mid}), instance, lora, sequence_length):
            low = mid
        else:
            high = mid - 1
    return low


def largest(instance: Instance, adapter: str, sequence_length: int = 4096) -> Largest:
    lora = adapters(adapter)
    catalogue = {name: entry.architecture for name, entry in models().items()}
    fitting = [name for name, arch in catalogue.items() if fits(arch, instance, lora, sequence_length)]
    model = max(fitting, key=lambda name: catalogue[name].parameters, default=None)
    best = ("", 0, 0)
    for name, arch in catalogue.items():
        layers = _deepest(arch, instance, lora, sequence_length)
        parameters = arch.model_copy(update={"layers": layers}).parameters if layers else 0
        if parameters > best[2]:
            best = (name, layers, parameters)
    return Largest(
        instance=instance.name,
        adapter=adapter,
        model=model,
        model_parameters=catalogue[model].parameters if model else 0,
        shape=best[0],
        layers=best[1],
        parameters=best[2],
    )


def table(sequence_length: int = 4096) -> list[str]:
    """A Markdown table: per instance type, the largest catalogue model and the largest deepened model that LoRA
    and QLoRA fit on one node."""

    def cell(found: Largest) -> str:
        named = f"{found.model} ({found.model_parameters / 1e9:.1f}B)" if found.model else "none"
        return f"{named}; {found.parameters / 1e9:.0f}B ({found.shape}, {found.layers} layers)"

    rows = [
        f"| instance type | LoRA (sequence {sequence_length:,}) | QLoRA (sequence {sequence_length:,}) |",
        "| --- | --- | --- |",
    ]
    for instance in instances().values():
        lora, qlora = (largest(instance, adapter, sequence_length) for adapter in ADAPTERS)
        rows.append(f"| {instance.name} ({instance.gpus} x {instance.gpu}) | {cell(lora)} | {cell(qlora)} |")
    return rows
