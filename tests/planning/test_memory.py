"""The memory model moment by moment: each moment of a step (``memory.PHASES``) set as the
peak by a setting where it is the largest, its breakdown against a count by hand, and the
memory block that ``plan --json`` and ``explain`` show.

Terms by hand, for the busiest rank (see ``tiered_training/planning/memory.py``): e bytes per
activation element (2 for BF16 and fp8, 4 for fp32), h hidden, kv the K/V width, f the
FFN width, V the vocabulary, t the tokens of a micro-batch, s its sequence length.
"""

from __future__ import annotations

import pytest

from tiered_training.contract.architecture import Architecture, sharded_elements
from tiered_training.planning import memory

GIB = 1024**3
# Distinct h, kv, f and head counts, so that a term taken for another shows.
TINY = dict(hidden_size=256, attention_heads=8, kv_heads=2, ffn_size=688, vocab_size=512)


def arch(layers=4, **kw) -> Architecture:
    return Architecture(layers=layers, **(TINY | kw))


def estimate(a, **kw) -> memory.MemoryBreakdown:
    args = {"precision": "bf16", "checkpointing": "none", "sequence_length": 4096, "micro_batch": 4,
            "shard_group": 8, "hbm_bytes": 80 * GIB} | kw
    return memory.estimate(a, **args)


def kept_none(a, e):
    """Per token: two RMSNorms (fp32 input, rsqrt, two h-wide), Q K V O, log-sum-exp, SwiGLU."""
    h, kv, f = a.hidden_size, a.kv_size, a.ffn_size
    return 2 * (4 * h + 4 + 2 * e * h) + e * (2 * h + 2 * kv) + 4 * a.attention_heads + 4 * e * f


def in_layer(a, e):
    """Gathered root, this layer and the prefetched one, the head's gradient, this layer's
    unsharded gradient and the fp32 reduce-scatter input."""
    return e * (a.root_parameters + 2 * a.layer_parameters) + e * a.vocab_size * a.hidden_size + (e + 4) * a.layer_parameters


def layer_grads(a, shard_group):
    return a.layers * sharded_elements(a.layer_shapes(), shard_group) * 4


@pytest.mark.parametrize("precision,e", [("bf16", 2), ("fp32", 4)])
def test_backward_of_one_layer_per_token(precision, e):
    a = arch()
    h, kv, f, heads = a.hidden_size, a.kv_size, a.ffn_size, a.attention_heads
    none = kept_none(a, e)
    # RMSNorm backward's four fp32 h-wide temporaries and the incoming gradient.
    assert memory.backward_bytes_per_token(a, precision, "none") == (e + 16) * h
    # The recompute brings back what "none" keeps; SwiGLU holds two f-wide gradients, two h-wide inputs freed.
    assert memory.backward_bytes_per_token(a, precision, "full") == none + e * (2 * f - 2 * h)
    assert memory.backward_bytes_per_token(a, precision, "selective") == none + e * (f - 4 * h - kv) - 4 * heads


def test_an_unknown_checkpointing_mode_is_named():
    for function in (memory.activation_bytes_per_token, memory.backward_bytes_per_token):
        with pytest.raises(ValueError, match="unknown activation checkpointing 'partial'"):
            function(arch(), "bf16", "partial")


@pytest.mark.parametrize("precision,e,per_logit", [("bf16", 2, 12), ("fp8", 2, 12), ("fp32", 4, 16)])
def test_loss_backward_peak(precision, e, per_logit):
    """Full checkpointing, a short sequence: the loss chunk's logits set the peak."""
    a = arch(vocab_size=65536)
    s, b = 2048, 2
    t, h, V = s * b, a.hidden_size, a.vocab_size
    est = estimate(a, precision=precision, checkpointing="full", sequence_length=s, micro_batch=b)
    rope = 2 * e * a.head_dim * s
    assert est.peak_at == "loss backward"
    assert est.unsharded_in_flight == e * (a.root_parameters + a.layer_parameters) + e * V * h
    assert est.activations == a.layers * e * h * t + rope
    assert est.logits_and_loss == (4 * h + 4 + 2 * e * h) * t + per_logit * 4096 * V + e * h * t
    assert est.gradients == memory.sharded_state_bytes(a, 8)["grad"]
    unchunked = estimate(a, precision=precision, checkpointing="full", sequence_length=s, micro_batch=b, loss_chunk_tokens=None)
    assert unchunked.logits_and_loss - est.logits_and_loss == per_logit * (t - 4096) * V


@pytest.mark.parametrize("precision,e", [("bf16", 2), ("fp32", 4)])
@pytest.mark.parametrize("accum", [None, 2, 1])
def test_top_layer_backward_peak(precision, e, accum):
    """No checkpointing, many tokens: every layer's activations and the top layer's backward."""
    a = arch()
    s, b = 4096, 8
    t, h = s * b, a.hidden_size
    est = estimate(a, precision=precision, sequence_length=s, micro_batch=b, grad_accum_steps=accum)
    assert est.peak_at == "top layer backward"
    assert est.unsharded_in_flight == in_layer(a, e)
    assert est.activations == a.layers * kept_none(a, e) * t + 2 * e * a.head_dim * s + ((e + 16) * h + e * h) * t
    assert est.logits_and_loss == 0
    # Sharded gradients are held from the second micro-batch of an accumulation on; with
    # one micro-batch per step none exists yet at the top layer.
    assert est.gradients == (0 if accum == 1 else memory.sharded_state_bytes(a, 8)["grad"])
    assert est.fragmentation == int(0.10 * (est.unsharded_in_flight + est.activations)) + memory.sharded_state_bytes(a, 8)["grad"] - est.gradients


def test_one_layer_peaks_at_its_backward_first():
    """With one layer, its backward is both the top and the bottom one: the step reaches the top first."""
    est = estimate(arch(layers=1), sequence_length=4096, micro_batch=8)
    assert est.peak_at == "top layer backward"


@pytest.mark.parametrize("precision,e", [("bf16", 2), ("fp32", 4)])
def test_bottom_layer_backward_peak_with_one_micro_batch(precision, e):
    """One micro-batch per step, unsharded, few tokens: the gradients the layers above have
    reduced outweigh their activations, so the bottom layer's backward is the peak."""
    a = arch(layers=8, vocab_size=256)
    s, b = 128, 1
    t, h = s * b, a.hidden_size
    est = estimate(a, precision=precision, checkpointing="full", sequence_length=s, micro_batch=b, shard_group=1, grad_accum_steps=1)
    assert est.peak_at == "bottom layer backward"
    assert est.unsharded_in_flight == in_layer(a, e)
    backward = kept_none(a, e) + e * (2 * a.ffn_size - 2 * h) + e * h
    assert est.activations == e * h * t + 2 * e * a.head_dim * s + backward * t
    assert est.logits_and_loss == 0
    assert est.gradients == int(7 / 8 * layer_grads(a, 1))
    # The caching allocator keeps the gradient blocks of the previous step reserved.
    assert est.reserved - est.allocated == int(0.10 * (est.unsharded_in_flight + est.activations)) + memory.sharded_state_bytes(a, 1)["grad"] - est.gradients


@pytest.mark.parametrize("precision,e", [("bf16", 2), ("fp32", 4)])
@pytest.mark.parametrize("accum", [1, 4])
def test_root_reduce_peak(precision, e, accum):
    """A vocabulary far wider than the layers, few tokens: the end of backward, when the
    embedding and head gradients are reduced, is the peak; every gradient exists then."""
    a = arch(layers=2, vocab_size=262144)
    s = 128
    est = estimate(a, precision=precision, checkpointing="full", sequence_length=s, micro_batch=1, grad_accum_steps=accum)
    assert est.peak_at == "root reduce"
    assert est.unsharded_in_flight == e * a.root_parameters + (e + 4) * a.root_parameters
    assert est.activations == 2 * e * a.head_dim * s
    assert est.logits_and_loss == 0
    assert est.gradients == memory.sharded_state_bytes(a, 8)["grad"]


def test_two_micro_batches_hold_the_gradients_throughout():
    a = arch(vocab_size=65536)
    one = estimate(a, checkpointing="full", sequence_length=2048, micro_batch=2, grad_accum_steps=1)
    two = estimate(a, checkpointing="full", sequence_length=2048, micro_batch=2, grad_accum_steps=2)
    assert one.peak_at == two.peak_at == "loss backward"
    assert one.gradients == 0
    assert two.gradients == memory.sharded_state_bytes(a, 8)["grad"]
    assert two.allocated - one.allocated == two.gradients


def test_the_memory_block_in_gib():
    """What ``plan --json`` (memory_gib) and ``explain`` show: each term in GiB to three decimals."""
    est = estimate(arch(), sequence_length=4096, micro_batch=8)
    shown = est.as_gib()
    terms = {"parameters": est.parameters, "gradients": est.gradients, "optimizer_states": est.optimizer_states,
             "unsharded_in_flight": est.unsharded_in_flight, "activations": est.activations,
             "logits_and_loss": est.logits_and_loss, "overhead": est.overhead, "total": est.total, "hbm": est.hbm}
    assert shown == {key: round(value / GIB, 3) for key, value in terms.items()}
    assert shown["hbm"] == 80.0 and shown["overhead"] > 4.0 and shown["activations"] == pytest.approx(est.activations / GIB, abs=5e-4)
    assert shown["activations"] != round(est.activations / GIB, 4)  # three decimals, not more
