"""Per-block ``torch.compile`` (inductor on the CPU; about 40 s on 2 cores, so one test)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.mark.torch
def test_compiled_blocks_match_eager_under_selective_checkpointing():
    from tiny import lm_loss, tiny_lm

    from training.components.ac import apply_ac
    from training.components.compile import apply_compile

    eager = tiny_lm()
    compiled = tiny_lm()
    assert all(torch.equal(a, b) for a, b in zip(eager.state_dict().values(), compiled.state_dict().values()))
    for lm in (eager, compiled):
        apply_ac(lm.model.layers, "selective")
    apply_compile(compiled.model.layers)
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    losses = []
    for lm in (eager, compiled):
        loss = lm_loss(lm, ids)
        loss.backward()
        losses.append(loss.item())
    # The same weights and tokens; inductor fuses and reorders the sums (norms, softmax, GEMM
    # epilogues). Each loss term passes through at most 10 rounded sums of at most 128 terms, each
    # within 128 u relative (u = 2**-24): the losses agree within 10 x 128 u = 7.6e-5 < 1e-4.
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)
    g_eager = eager.model.layers[0].mlp.up_proj.weight.grad
    g_comp = compiled.model.layers[0].mlp.up_proj.weight.grad
    # The gradient runs back through twice as many sums (20 x 128 u = 1.5e-4 of the magnitudes it
    # sums); compared as a whole tensor (L2), so that an element near zero cannot fail it alone.
    assert (g_comp - g_eager).norm() <= 1e-3 * g_eager.norm()
    assert set(compiled.state_dict()) == set(eager.state_dict())  # names unchanged for checkpoints and export
