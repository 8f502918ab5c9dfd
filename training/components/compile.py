"""Optional ``torch.compile`` of each decoder layer (one graph per block type, reused by all).

Compiled in place (``nn.Module.compile``), so parameter names and FSDP wrapping are unchanged.
"""

from __future__ import annotations

from torch import nn


def apply_compile(layers: nn.ModuleList) -> None:
    for layer in layers:
        layer.compile(fullgraph=False)
