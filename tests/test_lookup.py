"""Prompt-lookup baseline: drafts from the latest earlier n-gram, cycles counted as decoding would."""

import pytest

from draftlab.benchmark_acceptance.lookup import (
    lookup_acceptance,
    lookup_cycles,
    lookup_draft,
)


def test_draft_follows_the_latest_earlier_ngram():
    ctx = [1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    assert lookup_draft(ctx, 2) == [7, 8]  # the later of the two earlier "1 2 3"
    assert lookup_draft([5, 6, 7], 3) == []
    assert lookup_draft([4, 1, 4], 3) == [1, 4]  # falls back to n = 1


def test_cycles_of_a_repeating_output():
    # prompt "1 2 3 4", output repeats it: after the first token every draft of 3 is right
    prompt, out = [1, 2, 3, 4], [1, 2, 3, 4, 1, 2, 3, 4]
    assert lookup_cycles(prompt, out, steps=3) == 2  # 1 from the prefill, then 3 accepted + 1, then the last 3
    assert lookup_cycles(prompt, [9, 8, 7], steps=3) == 2  # nothing to look up: one token a cycle
    r = lookup_acceptance([prompt, prompt], [out, [9, 8, 7]], steps=3)
    assert r["acceptance_length"] == pytest.approx(11 / 4)
    with pytest.raises(ValueError):
        lookup_acceptance([prompt], [], steps=3)
