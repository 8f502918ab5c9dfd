"""Per-block ``torch.compile`` (inductor on the CPU; about 40 s on 2 cores, so one test)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.mark.torch
def test_compiled_blocks_match_eager_under_selective_checkpointing():
    from tiny import tiny_config
    from transformers import LlamaForCausalLM

    from training.ac import apply_ac
    from training.compile import apply_compile
    from training.model import hf_config

    config = hf_config(tiny_config().model)
    torch.manual_seed(0)
    eager = LlamaForCausalLM(config)
    compiled = LlamaForCausalLM(config)
    compiled.load_state_dict(eager.state_dict())
    for lm in (eager, compiled):
        apply_ac(lm.model.layers, "selective")
    apply_compile(compiled.model.layers)
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    losses = []
    for lm in (eager, compiled):
        loss = lm(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.item())
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)
    g_eager = eager.model.layers[0].mlp.up_proj.weight.grad
    g_comp = compiled.model.layers[0].mlp.up_proj.weight.grad
    assert torch.allclose(g_comp, g_eager, rtol=1e-3, atol=1e-6)
    assert set(compiled.state_dict()) == set(eager.state_dict())  # names unchanged for checkpoints and export
