"""The safeguard's training step runs a batch as length-sorted micro-batches: every row exactly once, each
group within the token budget unless a single row alone exceeds it."""

from __future__ import annotations

import math
import random

import pytest

from guard.recipe.cache import length_batches


def micro_batches(lengths, max_tokens):
    """As the safeguard's training step groups a batch: on the token budget alone."""
    return length_batches(lengths, max_tokens, slack=math.inf)


@pytest.mark.parametrize("seed", range(5))
def test_micro_batches_cover_every_row_once_within_budget(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(3, 256) for _ in range(rng.randint(1, 40))]
    groups = micro_batches(lengths, 512)
    flat = [i for g in groups for i in g]
    assert sorted(flat) == list(range(len(lengths)))
    for g in groups:
        longest = max(lengths[i] for i in g)
        assert len(g) * longest <= 512 or len(g) == 1
    # sorted by length: padding inside a group is only up to the group's own longest row
    assert [lengths[i] for i in flat] == sorted(lengths)


def test_micro_batches_pad_less_than_one_batch():
    lengths = [20] * 10 + [250, 256]
    groups = micro_batches(lengths, 1024)
    padded = sum(len(g) * max(lengths[i] for i in g) for g in groups)
    assert padded < len(lengths) * max(lengths) / 3
    assert micro_batches([300], 128) == [[0]]
