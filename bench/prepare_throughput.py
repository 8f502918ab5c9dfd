"""The pretraining Prepare step's tokenizing speed, per core, against the tokenizer's own batch encoding.

One run, one text: the repository's own Python and Markdown files (source code and prose), repeated to
``--megabytes``, written as JSON Lines files (``--files``, a unit each). The tokenizer is a byte-level BPE of
``--vocab`` tokens trained here on that text with Hugging Face ``tokenizers`` (nothing downloaded).

- ``ceiling``: ``Tokenizer.encode_batch_fast`` (or ``encode_batch``) of the same documents, already in memory,
  in batches of 512, one thread (``TOKENIZERS_PARALLELISM=false``), ids read out: the tokenizer's own rate;
- ``prepare 1`` / ``prepare 2``: ``training.corpus_prepare.prepare`` on a local folder with 1 and 2 processes,
  reading the files, splitting held-out documents, writing the shards with their SHA-256 and the markers; the rate
  is the one its own progress line reports over the units (pool start included), divided by the processes for
  the per-core figure; ``per CPU-s`` counts the whole job's CPU time (its pool's processes included), which a
  machine shared with other work does not distort.

Each path runs ``--rounds`` times, interleaved; the table shows each path's best round, the JSON every round.

Goals (issue 40): ``prepare 1`` at least 0.8 of ``ceiling``, and ``prepare 2`` at least 1.8x ``prepare 1`` on two
CPUs. Timings on a machine shared with other work understate the second; the JSON records the load average.

    .venv/bin/python bench/prepare_throughput.py            # table + bench/prepare_throughput.json
    .venv/bin/python bench/prepare_throughput.py --megabytes 8
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["TOKENIZERS_PARALLELISM"] = "false"


def corpus(megabytes: float) -> list[str]:
    """The repository's .py and .md files as documents, repeated to ``megabytes`` of text."""
    files = sorted(
        p
        for p in ROOT.rglob("*")
        if p.suffix in (".py", ".md") and ".venv" not in p.parts and "node_modules" not in p.parts
    )
    docs = [p.read_text(errors="replace") for p in files]
    docs = [d for d in docs if d.strip()]
    out, size = [], 0
    while size < megabytes * 2**20:
        for doc in docs:
            out.append(doc)
            size += len(doc.encode())
            if size >= megabytes * 2**20:
                break
    return out


def train_tokenizer(docs: list[str], vocab: int, path: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    raw.train_from_iterator(docs[: min(len(docs), 2000)], trainer=trainer)
    PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|endoftext|>").save_pretrained(path)
    return path


def ceiling(docs: list[str], tokenizer_dir: Path) -> dict:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
    started, cpu = time.perf_counter(), time.process_time()
    tokens = 0
    for i in range(0, len(docs), 512):
        for encoding in encode(docs[i : i + 512], add_special_tokens=False):
            tokens += len(encoding.ids) + 1
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {
        "tokens": tokens,
        "seconds": wall,
        "cpu_seconds": cpu,
        "tokens_per_second": tokens / wall,
        "tokens_per_cpu_second": tokens / cpu,
    }


def prepare(docs: list[str], tokenizer_dir: Path, work: Path, files: int, processes: int) -> dict:
    from tiered_training.contract.corpus import CorpusSpec
    from training import corpus_prepare

    raw = work / "raw"
    if not raw.exists():
        raw.mkdir(parents=True)
        for f in range(files):
            with open(raw / f"part-{f:03d}.jsonl", "w") as handle:
                for doc in docs[f::files]:
                    handle.write(json.dumps({"text": doc}) + "\n")
    spec = CorpusSpec.model_validate(
        {
            "sources": [{"name": "code", "uri": str(raw), "weight": 1}],
            "tokenizer": str(tokenizer_dir),
            "total_tokens": 1,
            "validation_fraction": 0.001,
        }
    )
    lines: list[str] = []
    out = work / f"prepared-{processes}"
    started, cpu, children = time.perf_counter(), time.process_time(), _children_cpu()
    corpus_prepare.prepare(spec, str(out), processes=processes, log=lines.append)
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu + _children_cpu() - children  # the pool's processes are reaped by now
    shutil.rmtree(out)
    last = [line for line in lines if "units tokenized" in line][-1]
    tokens, rate = (int(x.replace(",", "")) for x in re.findall(r"([\d,]+) tokens(?:/s)?", last))
    return {
        "processes": processes,
        "tokens": tokens,
        "tokens_per_second": rate,
        "per_core": rate / processes,
        "job_seconds": wall,
        "cpu_seconds": cpu,
        "tokens_per_cpu_second": tokens / cpu,
    }


def _children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=32.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=16000)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/prepare_throughput.json")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="prepare-bench-"))
    try:
        docs = corpus(args.megabytes)
        tokenizer_dir = train_tokenizer(docs, args.vocab, work / "tokenizer")
        rounds = []
        for _ in range(args.rounds):  # interleaved, so a change of the machine's load touches every path
            rounds.append(
                {
                    "ceiling": ceiling(docs, tokenizer_dir),
                    "prepare_1": prepare(docs, tokenizer_dir, work, args.files, 1),
                    "prepare_2": prepare(docs, tokenizer_dir, work, args.files, 2),
                }
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    top, one, two = (max((r[k] for r in rounds), key=lambda m: m["tokens_per_second"]) for k in rounds[0])
    per_core_ratio = one["per_core"] / top["tokens_per_second"]
    per_cpu_ratio = one["tokens_per_cpu_second"] / top["tokens_per_cpu_second"]
    speedup = two["tokens_per_second"] / one["tokens_per_second"]
    rows = [
        ("ceiling (encode_batch, 1 thread)", top["tokens_per_second"], top["tokens_per_second"], top, ""),
        ("prepare, 1 process", one["tokens_per_second"], one["per_core"], one, f"{per_core_ratio:.2f} of ceiling"),
        ("prepare, 2 processes", two["tokens_per_second"], two["per_core"], two, f"{speedup:.2f}x of 1 process"),
    ]
    head = f"path (best of {args.rounds} rounds)"
    print(f"{head:<34} {'tokens/s':>12} {'per core':>12} {'per CPU-s':>12}  note")
    for name, rate, core, row, note in rows:
        print(f"{name:<34} {rate:>12,.0f} {core:>12,.0f} {row['tokens_per_cpu_second']:>12,.0f}  {note}")
    print(
        f"goals: per core >= 0.8 of the ceiling: {per_core_ratio:.2f} by wall time, {per_cpu_ratio:.2f} by CPU time; "
        f"1 -> 2 processes >= 1.8x: {speedup:.2f}x (load average {os.getloadavg()[0]:.1f} on "
        f"{len(os.sched_getaffinity(0))} CPUs)"
    )
    document = {
        "text_megabytes": args.megabytes,
        "documents": len(docs),
        "vocab": args.vocab,
        "cpus": len(os.sched_getaffinity(0)),
        "load_average": os.getloadavg(),
        "ceiling": top,
        "prepare_1": one,
        "prepare_2": two,
        "rounds": rounds,
        "per_core_ratio": per_core_ratio,
        "per_cpu_second_ratio": per_cpu_ratio,
        "speedup_1_to_2": speedup,
        "goals": {"per_core_ratio": 0.8, "speedup_1_to_2": 1.8},
    }
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
