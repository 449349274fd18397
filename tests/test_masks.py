from __future__ import annotations

import pytest
import torch

from attnbench import masks


def test_valid_lengths_matches_d2l_masked_softmax():
    """The d2l example: masked_softmax(rand(2, 2, 4), tensor([2, 3]))."""
    x = torch.rand(2, 2, 4)
    mask = masks.valid_lengths(torch.tensor([2, 3]), 2, 4)  # (2, 1, 1, 4)
    probs = torch.softmax(x.masked_fill(~mask[:, 0], float("-inf")), -1)
    assert (probs[0, :, 2:] == 0).all() and (probs[1, :, 3:] == 0).all()
    assert (probs[0, :, :2] > 0).all() and torch.allclose(probs.sum(-1), torch.ones(2, 2))


def test_valid_lengths_2d_is_per_query():
    mask = masks.valid_lengths(torch.tensor([[1, 3], [2, 4]]), 2, 4)
    assert mask.shape == (2, 1, 2, 4)
    assert mask[0, 0].sum(-1).tolist() == [1, 3] and mask[1, 0].sum(-1).tolist() == [2, 4]


def test_causal_and_window_compose():
    m = masks.combine(masks.causal(5, 5), masks.sliding_window(5, 5, 1))
    assert m[0, 0].sum(-1).tolist() == [1, 2, 2, 2, 2]
    assert masks.combine(None, None) is None


def test_cross_attention_causal_shape():
    assert masks.causal(3, 7).shape == (1, 1, 3, 7)


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda: masks.causal(0, 4), ValueError, "lq"),
        (lambda: masks.sliding_window(4, 4, -1), ValueError, "window"),
        (lambda: masks.valid_lengths(torch.tensor([1.0]), 2, 2), TypeError, "valid_lens"),
        (lambda: masks.valid_lengths(torch.tensor([[1, 2, 3]]), 2, 4), ValueError, "Lq=2"),
        (lambda: masks.for_kind("diagonal", 1, 2, 2), ValueError, "mask kind"),
        (lambda: masks.combine(torch.ones(2, 2)), TypeError, "boolean"),
    ],
)
def test_bad_mask_arguments(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
