"""Token shards: the tokeniser script, packing, disjoint per-rank order, and resumable state."""

from __future__ import annotations

import gc
import json

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from training.components.data import PackedTokenWindows, build_dataloader, find_shards  # noqa: E402
from training.tools import tokenize_to_shards as tts  # noqa: E402

TEXTS = ["the cat sat on the mat", "a dog ran in the park and the cat sat", "héllo wörld"]


@pytest.fixture(autouse=True, scope="module")
def _no_process_groups_to_inherit():
    """A process group that an earlier module of this worker left to the garbage collector must be freed
    here: a DataLoader worker forked with it would free it again, without its threads, and hang."""
    gc.collect()


@pytest.fixture()
def shards(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    np.arange(0, 1000, dtype=np.uint16).tofile(data / "a.bin")
    np.arange(1000, 1700, dtype=np.uint16).tofile(data / "b.bin")
    return data


def test_byte_level_shards(tmp_path):
    files = []
    for i, text in enumerate(TEXTS):
        files.append(tmp_path / f"doc{i}.txt")
        files[-1].write_text(text, encoding="utf-8")
    assert tts.main([*map(str, files), "--byte-level", "--out", str(tmp_path / "out"), "--tokens-per-shard", "40"]) == 0
    manifest = json.loads((tmp_path / "out" / "shards.json").read_text())
    tokens = np.concatenate([np.fromfile(tmp_path / "out" / s["file"], dtype=np.uint16) for s in manifest["shards"]])
    expected = []
    for text in TEXTS:
        expected += list(text.encode()) + [tts.BYTE_EOT]
    assert tokens.tolist() == expected
    assert manifest["dtype"] == "uint16" and all(s["tokens"] <= 40 for s in manifest["shards"])
    assert len(find_shards(tmp_path / "out", "uint16")) == len(manifest["shards"])


def test_hf_tokenizer_from_local_dir(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(TEXTS * 10, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<eos>"]))
    PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>", unk_token="<unk>").save_pretrained(tmp_path / "tok")
    doc = tmp_path / "corpus.txt"
    doc.write_text("\n".join(TEXTS) + "\n\n")
    assert tts.main([str(doc), "--tokenizer", str(tmp_path / "tok"), "--lines", "--out", str(tmp_path / "out")]) == 0
    tokens = np.fromfile(tmp_path / "out" / "shard-00000.bin", dtype=np.uint16).tolist()
    tok = AutoTokenizer.from_pretrained(tmp_path / "tok")
    expected = []
    for text in TEXTS:
        expected += tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
    assert tokens == expected
    assert tok.decode(tokens[: tokens.index(tok.eos_token_id)]) == TEXTS[0]


def test_windows_are_packed_and_shifted(shards):
    ds = PackedTokenWindows(shards, "uint16", 32, rank=0, world_size=1, seed=0)
    assert ds.windows == (999 // 32) + (699 // 32)  # windows never cross a shard boundary
    for window in list(_take(ds, ds.windows)):
        assert window.shape == (33,) and window.dtype == torch.int64
        assert torch.equal(window[1:] - window[:-1], torch.ones(32, dtype=torch.int64))  # contiguous tokens


def test_ranks_read_disjoint_data_in_a_seeded_order(shards):
    per_rank = [
        [tuple(w.tolist()) for w in _take(PackedTokenWindows(shards, "uint16", 32, rank=r, world_size=3, seed=7), 16)]
        for r in range(3)
    ]
    flat = [w for rank in per_rank for w in rank]
    assert len(set(flat)) == len(flat)  # disjoint
    again = [tuple(w.tolist()) for w in _take(PackedTokenWindows(shards, "uint16", 32, rank=1, world_size=3, seed=7), 16)]
    assert again == per_rank[1]  # deterministic
    other = [tuple(w.tolist()) for w in _take(PackedTokenWindows(shards, "uint16", 32, rank=1, world_size=3, seed=8), 16)]
    assert other != per_rank[1]  # the seed matters


def test_dataloader_state_resumes_exactly_across_epochs(shards):
    def loader():
        return build_dataloader(shards, "uint16", 32, 4, rank=0, world_size=2, seed=3)

    first = loader()
    it = iter(first)
    for _ in range(5):  # 20 of the 26 windows per rank: the next batches cross into epoch 1
        next(it)
    state = first.state_dict()
    expected = [next(it) for _ in range(6)]
    second = loader()
    second.load_state_dict(state)
    it2 = iter(second)
    for want in expected:
        assert torch.equal(next(it2), want)


def test_state_of_other_data_is_refused(shards, tmp_path):
    ds = PackedTokenWindows(shards, "uint16", 32, rank=0, world_size=2, seed=0)
    with pytest.raises(ValueError, match="the data changed"):
        ds.load_state_dict({"position": 4, "windows": ds.windows + 1, "seed": 0})
    ds.load_state_dict(PackedTokenWindows(shards, "uint16", 32, rank=0, world_size=4, seed=0).state_dict())  # any world


def _take(dataset, n):
    it = iter(dataset)
    return [next(it) for _ in range(n)]


def test_one_background_worker_resumes_exactly(shards):
    def loader():
        return build_dataloader(shards, "uint16", 32, 4, rank=1, world_size=2, seed=3, num_workers=1)

    reference = [b for _, b in zip(range(8), build_dataloader(shards, "uint16", 32, 4, rank=1, world_size=2, seed=3))]
    first = loader()
    it = iter(first)
    got = [next(it) for _ in range(3)]
    state = first.state_dict()
    second = loader()
    second.load_state_dict(state)
    it2 = iter(second)
    got += [next(it2) for _ in range(5)]
    assert all(torch.equal(a, b) for a, b in zip(got, reference))
