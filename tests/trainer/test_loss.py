"""The chunked vocabulary loss: exact against the plain loss, and never a full logits tensor."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from training.components.loss import chunked_cross_entropy  # noqa: E402

B, S, H, V, CHUNK = 2, 64, 32, 256, 24


class _Largest(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[-1] == V and tuple(t.shape) != (H, V):  # logits-shaped (not weight.T)
                self.largest = max(self.largest, t.numel())
        return out


def _inputs(dtype):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(B, S, H, generator=g, dtype=dtype, requires_grad=True)
    weight = torch.randn(V, H, generator=g, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, V, (B, S), generator=g)
    labels[0, :5] = -100
    return hidden, weight, labels


def test_matches_full_cross_entropy_and_gradients():
    hidden, weight, labels = _inputs(torch.float32)
    loss = chunked_cross_entropy(hidden, weight, labels, CHUNK)
    loss.backward()
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    reference = F.cross_entropy((hidden @ weight.t()).reshape(-1, V), labels.reshape(-1), ignore_index=-100)
    reference.backward()
    torch.testing.assert_close(loss, reference)
    torch.testing.assert_close(grads[0], hidden.grad)
    torch.testing.assert_close(grads[1], weight.grad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_no_tensor_larger_than_one_chunk_of_logits(dtype):
    hidden, weight, labels = _inputs(dtype)
    with _Largest() as seen:
        chunked_cross_entropy(hidden, weight, labels, CHUNK).backward()
    assert 0 < seen.largest <= CHUNK * V < B * S * V
