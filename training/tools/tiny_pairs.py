"""Tiny preference pairs for tests and rehearsals: the user gives words, the chosen answer reverses them, the
rejected one repeats them; with the tiny chat tokenizer (``training.tools.tiny_chat``).

    python -m training.tools.tiny_pairs OUT [--pairs 64] [--seed 0] [--sequence-length N [--dtype uint16]]

writes OUT/tokenizer and OUT/pairs.jsonl (conversations, trl's explicit-prompt form); with
``--sequence-length`` also OUT/prepared (``python -m training.dpo_data``, pairs too long dropped).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from training.tools.tiny_chat import CHAT_WORDS, tiny_chat_tokenizer


def tiny_pairs(n: int, *, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    records = []
    for _ in range(n):
        words = [str(w) for w in rng.choice(CHAT_WORDS, size=int(rng.integers(2, 4)), replace=False)]
        records.append(
            {
                "prompt": [{"role": "user", "content": " ".join(words)}],
                "chosen": [{"role": "assistant", "content": " ".join(reversed(words))}],
                "rejected": [{"role": "assistant", "content": " ".join(words)}],
            }
        )
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.tools.tiny_pairs", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--pairs", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sequence-length", type=int)
    parser.add_argument("--dtype", choices=["uint16", "uint32"])
    args = parser.parse_args(argv)
    tokenizer = tiny_chat_tokenizer(args.out / "tokenizer")
    pairs = args.out / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(r) + "\n" for r in tiny_pairs(args.pairs, seed=args.seed)))
    if args.sequence_length is None:
        return 0
    from training.dpo_data import main as prepare

    options = ["--dtype", args.dtype] if args.dtype else []
    return prepare(
        [
            str(pairs),
            "--tokenizer",
            str(tokenizer),
            "--out",
            str(args.out / "prepared"),
            "--sequence-length",
            str(args.sequence_length),
            "--overlong",
            "drop",
            *options,
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
