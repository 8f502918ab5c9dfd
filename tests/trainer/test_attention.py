"""Packed attention through FlexAttention's block mask (training/models/attention.py): the same mask as the
dense one, block by block; the same outputs as SDPA under the dense mask; packed examples that do not see
each other. The CPU runs FlexAttention compiled and without gradients only (PyTorch 2.13 has no CPU
backward for it), so these tests run under ``torch.no_grad``; training on the CPU keeps the dense mask.

Tolerances (float32, eps = 2^-23). One attention output is a dot product of ``D`` terms per score, then a
softmax and a weighted sum over at most ``N`` keys; a sum of n terms in any order is within n * eps of
the exact one relative to the sum of its terms' magnitudes (Higham, "Accuracy and Stability of Numerical
Algorithms", 2nd ed., section 3.1), so two kernels differ by at most about ``(D + 2 N) * eps`` relative to
the output's norm: ``ATTENTION_TOL``. Through the model, ``MODEL_TOL`` is test_packing's bound: about
12 operations in sequence, each a sum of at most 256 terms.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tiny import VOCAB  # noqa: E402
from torch.nn.attention.flex_attention import BlockMask, create_block_mask  # noqa: E402

from tiered_training.contract.runconfig import ModelConfig  # noqa: E402
from training.models.attention import (  # noqa: E402
    CPU_FLEX_MIN_TOKENS,
    block_mask,
    dense_mask,
    document_ids,
    document_mask,
    sdpa_attention,
)
from training.models.decoder import CausalLM, lm_config, materialize  # noqa: E402

EPS32 = torch.finfo(torch.float32).eps
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16  # the model's below
LENGTHS = (100, 60, 96, 64)  # 320 tokens: two whole blocks of 128 and a partial one
N = sum(LENGTHS)
ATTENTION_TOL = (HEAD_DIM + 2 * N) * EPS32
MODEL_TOL = 12 * 256 * EPS32


def positions(lengths) -> torch.Tensor:
    return torch.cat([torch.arange(length) for length in lengths])[None]


def close(a, b, tol) -> bool:
    scale = max(1.0, float(torch.linalg.vector_norm(b)))
    return float(torch.linalg.vector_norm(a - b)) <= tol * scale


@pytest.mark.parametrize(
    ("lengths", "block"),
    [
        ((9, 6, 11, 6), 8),  # the last block partial
        ((16, 8, 8, 32), 8),  # examples on block boundaries: whole blocks skipped or computed unmasked
        ((3, 40, 2, 3), 8),  # an example spanning several blocks between two short ones
        (LENGTHS, 128),
        ((20, 300, 1), 128),
    ],
)
def test_the_block_mask_is_the_dense_mask_by_blocks(lengths, block):
    """Block by block, the mask built from the examples' spans equals the one FlexAttention computes from
    the dense rule: the same key blocks per query block, and the same of them computed without a mask."""
    example = document_ids(positions(lengths))
    mine = block_mask(example, block)
    doc = example
    reference = create_block_mask(
        lambda b, h, q, k: (q >= k) & (doc[b, q] == doc[b, k]),
        1,
        None,
        sum(lengths),
        sum(lengths),
        "cpu",
        BLOCK_SIZE=block,
    )
    assert torch.equal(mine.to_dense(), reference.to_dense())
    assert torch.equal(mine.full_kv_num_blocks, reference.full_kv_num_blocks)
    # and its element rule is the dense mask
    q, k = torch.meshgrid(torch.arange(sum(lengths)), torch.arange(sum(lengths)), indexing="ij")
    assert torch.equal(mine.mask_mod(0, 0, q, k), dense_mask(example)[0, 0])


def test_the_kernel_skips_the_blocks_between_examples():
    """Four examples of 1024 tokens in 4096: 4 x 36 of the 528 causal blocks are computed."""
    mask = block_mask(document_ids(positions((1024,) * 4)))
    assert int(mask.to_dense().sum()) == 4 * 8 * 9 // 2
    assert int(mask.full_kv_num_blocks.sum()) == 4 * 8 * 7 // 2  # below each example's diagonal: no element mask


def test_where_each_mask_runs():
    """The block mask wherever compiled FlexAttention runs; the dense mask for CPU gradients, float64 and
    CPU rows shorter than CPU_FLEX_MIN_TOKENS (where compiling costs more than the mask); none for one
    sequence per row."""
    packed = positions(LENGTHS * (CPU_FLEX_MIN_TOKENS // N + 1))
    assert document_mask(torch.arange(N)[None], torch.float32) is None
    with torch.no_grad():
        assert isinstance(document_mask(packed, torch.float32), BlockMask)
        assert isinstance(document_mask(packed, torch.bfloat16), BlockMask)
        assert isinstance(document_mask(packed, torch.float64), torch.Tensor)
        assert isinstance(document_mask(positions(LENGTHS), torch.float32), torch.Tensor)  # a short row
    assert isinstance(document_mask(packed, torch.float32), torch.Tensor)  # gradients on the CPU


@pytest.mark.parametrize("threads", [1, 2])
def test_flex_attention_equals_sdpa_under_the_dense_mask(threads):
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    torch._dynamo.reset()  # Inductor's CPU kernels take the thread count they were compiled with
    try:
        generator = torch.Generator().manual_seed(threads)
        q = torch.randn(2, HEADS, N, HEAD_DIM, generator=generator)
        k, v = (torch.randn(2, KV_HEADS, N, HEAD_DIM, generator=generator) for _ in range(2))
        packed = torch.cat([positions(LENGTHS), positions((50, 250, 20))])  # two rows, two layouts
        example = document_ids(packed)
        with torch.no_grad():
            flex = sdpa_attention(None, q, k, v, block_mask(example), HEAD_DIM**-0.5)
            dense = sdpa_attention(None, q, k, v, dense_mask(example), HEAD_DIM**-0.5)
    finally:
        torch.set_num_threads(previous)
    assert flex.shape == (2, N, HEADS, HEAD_DIM)
    assert close(flex, dense, ATTENTION_TOL)
    assert not close(flex, sdpa_attention(None, q, k, v, None, HEAD_DIM**-0.5), 100 * ATTENTION_TOL)


@pytest.fixture(scope="module")
def lm():
    dims = dict(hidden_size=HEADS * HEAD_DIM, attention_heads=HEADS, kv_heads=KV_HEADS, ffn_size=128)
    model = CausalLM(lm_config(ModelConfig(name="t", layers=2, vocab_size=VOCAB, max_sequence_length=512, **dims)))
    materialize(model, torch.device("cpu"), seed=5)
    return model.eval()


def test_packed_examples_through_the_block_mask_are_the_examples_alone(lm, monkeypatch):
    """Each example's logits in the pack (block mask) equal its logits alone (plain causal SDPA) and its
    logits in the pack under the dense mask; other tokens in the first example change nothing else."""
    import training.models.attention as attention

    monkeypatch.setattr(attention, "CPU_FLEX_MIN_TOKENS", 0)  # this short pack through the block mask
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (1, N), generator=generator)
    other = tokens.clone()
    other[0, : LENGTHS[0]] = torch.randint(0, VOCAB, (LENGTHS[0],), generator=generator)
    packed = positions(LENGTHS)
    with torch.no_grad():
        flex, moved = lm(tokens, packed), lm(other, packed)
    dense = lm(tokens, packed).detach()  # with gradients recorded: the dense mask
    start = 0
    for length in LENGTHS:
        span = slice(start, start + length)
        with torch.no_grad():
            alone = lm(tokens[:, span])
        assert close(flex[:, span], alone, MODEL_TOL)
        assert close(flex[:, span], dense[:, span], MODEL_TOL)
        if start:
            assert close(moved[:, span], flex[:, span], MODEL_TOL)
        start += length
    with torch.no_grad():  # as one causal sequence the second example sees the first: this test sees a leak
        leak = lm(other)[:, LENGTHS[0] :] - lm(tokens)[:, LENGTHS[0] :]
    assert float(leak.abs().max()) > 100 * MODEL_TOL


@pytest.mark.parametrize("lengths", [LENGTHS, (1000, 3000, 96)])
def test_the_planner_counts_the_block_masks_bytes(lengths):
    """``planning.memory.block_mask_bytes`` is the block mask's index tensors and the example ids it reads."""
    from tiered_training.planning.memory import block_mask_bytes

    example = document_ids(positions(lengths))
    tensors = [t for t in block_mask(example).as_tuple() if isinstance(t, torch.Tensor)]
    held = sum(t.numel() * t.element_size() for t in tensors) + example.numel() * example.element_size()
    assert block_mask_bytes(sum(lengths)) == held
