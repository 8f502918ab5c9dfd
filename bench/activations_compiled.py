"""What a compiled decoder layer keeps for backward without checkpointing, per token.

``torch.compile`` (Inductor) partitions each block's forward and backward and decides
which tensors the backward gets saved and which it recomputes; the fp32 upcasts of the
RMSNorms, for one, are recomputed. The planner counts that per saved tensor
(``tiered_training.planning.memory.activation_bytes_per_token(..., "none", compiled=True)``). This
measures it: the trainer's decoder (training/models/decoder.py) with each decoder layer compiled as the
trainer does (``training.components.compile.apply_compile``), every distinct storage that autograd
saves counted once (``saved_tensors_hooks``), per layer = saved(2 layers) - saved(1
layer), so the embedding, the RoPE tables and the final norm cancel. FP8 cases convert the
linears as the trainer does (``training.components.float8.apply_float8``: torchao's Float8Linear,
whose ``_scaled_mm`` runs on the CPU). On the CPU, one to a few minutes per case on 2 cores; the
partitioner's choice of what to save is the same on a GPU.

    .venv/bin/python bench/activations_compiled.py      # table + bench/activations_compiled.json

``tests/planning/test_memory_compiled.py`` checks the planner's formula against the recorded result.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SEQ, BATCH = 64, 2
# Shapes that tell the terms apart: GQA or not, different FFN widths, BF16, fp32 and FP8 (torchao's
# Float8Linear with each recipe the trainer offers on Hopper; BF16 around the linears).
SMALL = {"hidden_size": 128, "attention_heads": 4, "kv_heads": 2, "ffn_size": 352}
WIDE = {"hidden_size": 192, "attention_heads": 6, "kv_heads": 6, "ffn_size": 512}
CASES = [
    (SMALL, "bf16", None),
    (SMALL, "fp32", None),
    (WIDE, "bf16", None),
    (SMALL, "fp8", "tensorwise"),
    (SMALL, "fp8", "rowwise"),
    (WIDE, "fp8", "tensorwise"),
    (WIDE, "fp8", "rowwise"),
]
# LoRA (rank 8 on every projection, no dropout) on a frozen BF16 base, and on a frozen float8 one.
LORA_RANK = 8
LORA_CASES = [(SMALL, "bf16", None), (SMALL, "fp8", "tensorwise")]


def autograd_saved_bytes(lm, ids) -> int:
    """Bytes of the distinct storages autograd saves in one forward of ``lm.model`` (a tensor
    saved by two ops counts once; parameters and buffers are not counted)."""
    import torch

    params = {p.untyped_storage().data_ptr() for p in [*lm.parameters(), *lm.buffers()]}
    saved: dict[int, int] = {}
    keep = []  # hold every saved tensor so no address is reused while counting

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        keep.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        hidden = lm.model(ids)
    hidden.sum().backward()
    return sum(saved.values())


def saved_bytes(shape: dict, layers: int, dtype, compiled: bool, fp8_recipe: str | None = None, lora_rank: int = 0) -> int:
    import torch

    from tiered_training.contract.runconfig import ModelConfig, PrecisionConfig
    from training.components.compile import apply_compile
    from training.components.float8 import apply_float8
    from training.models.decoder import CausalLM, lm_config

    torch.manual_seed(0)
    lm = CausalLM(lm_config(ModelConfig(name="t", layers=layers, vocab_size=256, max_sequence_length=256, **shape))).to(dtype)
    if lora_rank:  # the trainer's adapters (training/models/lora.py), in the compute dtype as FSDP2 runs them
        from tiered_training.contract.runconfig import LoraConfig
        from training.models.lora import apply_lora

        apply_lora(lm, LoraConfig(rank=lora_rank, alpha=2 * lora_rank, dropout=0.0))
    if fp8_recipe is not None:  # the trainer's float8 conversion: torchao's Float8Linear, BF16 around it
        precision = PrecisionConfig(precision="fp8", fp8_recipe=fp8_recipe, activation_checkpointing="none")
        apply_float8(lm, precision)
    if compiled:
        apply_compile(lm.model.layers)
    return autograd_saved_bytes(lm, torch.randint(0, 256, (BATCH, SEQ)))


def main(argv=None) -> int:
    import torch

    from tiered_training.contract.architecture import Architecture, Lora
    from tiered_training.contract.runconfig import LORA_TARGET_MODULES
    from tiered_training.planning.memory import activation_bytes_per_token

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench/activations_compiled.json")
    args = parser.parse_args(argv)
    rows = []
    cases = [(*case, 0) for case in CASES] + [(*case, LORA_RANK) for case in LORA_CASES]
    for shape, precision, fp8_recipe, rank in cases:
        dtype = torch.float32 if precision == "fp32" else torch.bfloat16
        start = time.time()
        row = {"shape": shape, "precision": precision, "fp8_recipe": fp8_recipe, "torch": torch.__version__}
        if rank:
            row["lora_rank"] = rank
        for name, compiled in (("eager", False), ("compiled", True)):
            torch._dynamo.reset()
            per_layer = saved_bytes(shape, 2, dtype, compiled, fp8_recipe, rank) - saved_bytes(
                shape, 1, dtype, compiled, fp8_recipe, rank
            )
            row[f"{name}_bytes_per_token"] = per_layer / (SEQ * BATCH)
        arch = Architecture(layers=1, vocab_size=256, max_sequence_length=256, **shape)
        lora = Lora(rank, tuple(LORA_TARGET_MODULES), dropout=False) if rank else None
        row["planned_eager"] = activation_bytes_per_token(arch, precision, "none", lora)
        row["planned_compiled"] = activation_bytes_per_token(arch, precision, "none", lora, compiled=True)
        rows.append(row)
        print(f"{json.dumps(shape)} {precision} {fp8_recipe or ''}{f' LoRA r{rank}' if rank else ''}: eager {row['eager_bytes_per_token']:g} (planner {row['planned_eager']}), "
              f"compiled {row['compiled_bytes_per_token']:g} (planner {row['planned_compiled']}) bytes/token/layer, "
              f"{time.time() - start:.0f} s", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"seq": SEQ, "batch": BATCH, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
