"""Raw corpora in every format the Prepare step reads, and a small byte-level BPE tokenizer trained here
(nothing downloaded), for tests/trainer/test_corpus_prepare.py and bench/prepare_throughput.py."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an they "
    "you were her she there been one all we their has would when if so no will more can said what up its about "
    "def return import class self None print range len café naïve 東京 ünïcode"
).split()
EOS = "<|endoftext|>"


def documents(count: int, *, seed: int = 0, words: tuple[int, int] = (3, 40)) -> list[str]:
    """``count`` documents of random words and punctuation (some with newlines and non-ASCII text)."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(count):
        picked = [str(w) for w in rng.choice(WORDS, size=int(rng.integers(*words)))]
        text = " ".join(picked)
        if rng.random() < 0.3:
            text = text.replace(" the ", ".\nThe ", 1)
        docs.append(text.capitalize() + ".")
    return docs


def bpe_tokenizer(path: Path, vocab_size: int = 400) -> Path:
    """A byte-level BPE (every string encodes) with an end-of-text token, saved as a Hugging Face tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    raw.train_from_iterator(documents(300, seed=99), trainer=trainer)
    PreTrainedTokenizerFast(tokenizer_object=raw, eos_token=EOS).save_pretrained(path)
    return Path(path)


def write_format(folder: Path, fmt: str, docs: list[str]) -> Path:
    """``docs`` as one source of format ``fmt`` under ``folder``: parquet (2 row groups), jsonl, json, text (a file
    per document), text_lines, saved_dataset, jsonl.gz, text_lines.zst. Returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table({"id": list(range(len(docs))), "text": docs})
        pq.write_table(table, folder / "part-0.parquet", row_group_size=max(1, (len(docs) + 1) // 2))
    elif fmt == "jsonl":
        (folder / "a.jsonl").write_text("".join(json.dumps({"text": d, "n": i}) + "\n" for i, d in enumerate(docs)))
    elif fmt == "json":
        (folder / "a.json").write_text(json.dumps([{"text": d} for d in docs]))
    elif fmt == "text":
        for i, doc in enumerate(docs):
            (folder / f"doc-{i:04d}.txt").write_text(doc)
    elif fmt == "text_lines":
        (folder / "lines.txt").write_text("".join(d.replace("\n", " ") + "\n" for d in docs))
    elif fmt == "saved_dataset":
        import datasets

        datasets.Dataset.from_dict({"text": docs}).save_to_disk(str(folder / "ds"))
    elif fmt == "gz":
        with gzip.open(folder / "a.jsonl.gz", "wt", encoding="utf-8") as handle:
            handle.write("".join(json.dumps({"text": d}) + "\n" for d in docs))
    elif fmt == "zst":
        import pyarrow as pa

        with pa.output_stream(str(folder / "lines.txt.zst"), compression="zstd") as handle:
            handle.write("".join(d.replace("\n", " ") + "\n" for d in docs).encode())
    else:
        raise ValueError(fmt)
    return folder
