"""Issue 28's fault battery: each trial that was silently wrong, crashed, lost work or failed obscurely,
planted here so it stays fixed (the correctness gate's blind spots are planted in tests/test_gate.py).
"""

from __future__ import annotations

import pytest
import torch

import attnbench
from attnbench import mask_mods, masks
from attnbench.reference import reference_attention


# ---- 4: a predicate is known by identity, not by its name ------------------------------------
def _strictly_causal() -> mask_mods.MaskMod:
    return mask_mods.MaskMod("causal", lambda b, h, q, kv: kv < q)  # named "causal", sees less


@pytest.mark.parametrize("name", ["sdpa", "sdpa_math", "sdpa_flash"])
def test_sdpa_runs_a_custom_predicate_named_causal_as_what_it_computes(name):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4, dtype=torch.float64, generator=gen) for _ in range(3))
    mod = _strictly_causal()
    assert not mod.is_causal and masks.kind_of(mod) is None
    expected = reference_attention(q, k, v, mask_mods.dense(mod, 1, 2, 8, 8))
    torch.testing.assert_close(attnbench.get_variant(name)(q, k, v, mod), expected)
    assert mask_mods.causal().is_causal and masks.kind_of(mask_mods.causal()) == "causal"
