"""Packed-sequence attention on a device: examples packed in one sequence against each run alone.

A Llama-shaped model with random weights runs one packed sequence (several examples, positions
restarting per example, as the trainer gives them) and each example by itself. It reports:

- ``mask``: the packed sequence's mask in evaluation, ``block`` (FlexAttention's block mask, compiled
  FlexAttention) or ``dense`` (a boolean N x N tensor for SDPA; see ``training/models/attention.py``);
- ``kernels``: the attention kernels that ran for the packed sequence and for a single example
  (profiler names: SDPA's aten ops, on CUDA the flash kernel for one example; Inductor's template
  kernels, ``triton_tem_*``, for FlexAttention on CUDA; compiled FlexAttention on the CPU shows
  no kernel of its own);
- ``relative_error``: the largest, over the examples, of ``|logits packed - logits alone| /
  |logits alone|`` (vector norms), against ``tolerance``;
- ``leak``: the same quantity when the positions are left out (one causal sequence: the examples
  see each other and RoPE does not restart), which must be far above the tolerance;
- ``packed_ms`` and ``causal_ms``: forward and backward of the packed sequence with its document
  mask and of the same tokens as one causal sequence (no mask), the cost of the mask path (the CPU
  trains on the dense mask: FlexAttention has no CPU backward).

Tolerance: ``dtype``'s eps times ``DEPTH``, the rounded operations in sequence between the
embedding and the logits (per layer: attention and MLP outputs; then the final norm and the
head). Each kernel accumulates in fp32 and rounds once to ``dtype``, so two kernels' outputs
differ by at most about one unit in the last place per rounded operation.

    python -m training.tools.packing_check --out packing.json            # CUDA, bf16
    python -m training.tools.packing_check --cpu --out packing.json      # the same on the CPU, fp32, tiny
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch.nn.attention.flex_attention import BlockMask

from tiered_training.contract.runconfig import ModelConfig
from training.models.attention import document_mask
from training.models.decoder import build_model, materialize

GPU_MODEL = {
    "layers": 2,
    "hidden_size": 2048,
    "attention_heads": 16,
    "kv_heads": 8,
    "ffn_size": 8192,
    "vocab_size": 32768,
    "max_sequence_length": 8192,
}
CPU_MODEL = {
    "layers": 2,
    "hidden_size": 64,
    "attention_heads": 4,
    "kv_heads": 2,
    "ffn_size": 128,
    "vocab_size": 256,
    "max_sequence_length": 256,
}
GPU_LENGTHS = (1500, 700, 1200, 596)  # 3996 tokens of 4 examples, then padding to 4096
CPU_LENGTHS = (9, 6, 11, 3)


def _model(dims: dict, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    config = ModelConfig(name="packing-check", rope_theta=500000.0, **dims)
    lm = build_model(config)
    materialize(lm, device, seed=0)
    return lm.to(dtype)


def _kernels(run) -> list[str]:
    from torch.profiler import profile

    with profile() as prof:
        run()
    return sorted(
        {
            e.name
            for e in prof.events()
            if ("attention" in e.name and e.name.startswith("aten::_")) or e.name.startswith("triton_tem")
        }
    )


def _timed(run, device: torch.device, repeats: int) -> float:
    run()  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - started) / repeats * 1000


def check(
    device: torch.device, dtype: torch.dtype, dims: dict, lengths: tuple[int, ...], sequence: int, repeats: int = 3
) -> dict:
    import training.models.attention as attention

    # This check is of the block mask: on the CPU its short rows take it too (the trainer's threshold for
    # the CPU, CPU_FLEX_MIN_TOKENS, weighs compile time, which a check does not).
    attention.CPU_FLEX_MIN_TOKENS = 0
    lm = _model(dims, device, dtype)
    generator = torch.Generator().manual_seed(1)
    examples = [torch.randint(1, dims["vocab_size"], (n,), generator=generator) for n in lengths]
    pad = sequence - sum(lengths)
    tokens = torch.cat([*examples, torch.zeros(pad, dtype=torch.int64)])[None].to(device)
    positions = torch.cat([torch.arange(n) for n in (*lengths, pad)])[None].to(device)
    starts = [sum(lengths[:i]) for i in range(len(lengths))]

    def logits(ids, pos=None):
        with torch.no_grad():
            return lm(ids, pos).float()

    def worst(packed) -> float:
        errors = []
        for start, example in zip(starts, examples):
            alone = logits(example[None].to(device))[0]
            errors.append(
                float(
                    torch.linalg.vector_norm(packed[0, start : start + len(example)] - alone)
                    / torch.linalg.vector_norm(alone)
                )
            )
        return max(errors)

    def step(pos):
        def run():
            loss = lm(tokens, pos).float().square().mean()
            loss.backward()
            lm.zero_grad(set_to_none=True)

        return run

    with torch.no_grad():
        mask = document_mask(positions, dtype)
    depth = 2 * dims["layers"] + 2
    tolerance = depth * torch.finfo(dtype).eps
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "sequence": sequence,
        "examples": list(lengths),
        "model": dims,
        "torch": torch.__version__,
        "mask": "block" if isinstance(mask, BlockMask) else "dense",
        "kernels": {
            "packed": _kernels(lambda: logits(tokens, positions)),
            "single": _kernels(lambda: logits(examples[0][None].to(device))),
        },
        "relative_error": worst(logits(tokens, positions)),
        "leak": worst(logits(tokens)),
        "tolerance": tolerance,
        "packed_ms": round(_timed(step(positions), device, repeats), 2),
        "causal_ms": round(_timed(step(None), device, repeats), 2),
    }
    result["passed"] = result["relative_error"] <= tolerance and result["leak"] > 10 * tolerance
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.tools.packing_check", description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="a tiny model in fp32 on the CPU")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.cpu:
        result = check(torch.device("cpu"), torch.float32, CPU_MODEL, CPU_LENGTHS, 32)
    elif torch.cuda.is_available():
        result = check(torch.device("cuda", 0), torch.bfloat16, GPU_MODEL, GPU_LENGTHS, 4096)
    else:
        print("packing_check: no CUDA device; --cpu runs it on the CPU", file=sys.stderr)
        return 2
    text = json.dumps(result, indent=2)
    if args.out is not None:
        args.out.write_text(text)
    print(text)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
