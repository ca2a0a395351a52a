"""Prompt-lookup drafting, simulated exactly on a target's greedy outputs: a free baseline drafter.

Why: a trained draft's acceptance length means little without a reference. Prompt lookup (the
n-gram drafter behind SGLang's NGRAM algorithm and transformers' `prompt_lookup_num_tokens`) drafts
the tokens that followed the last earlier occurrence of the context's final n-gram. It needs no
weights, and at temperature 0 its acceptance is fully determined by the greedy output, so it can be
computed from the tokens the reference engine already decoded, without another decode.
"""

from __future__ import annotations

from draftlab.core.acceptance import acceptance_length


def lookup_draft(context: list[int], steps: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Up to `steps` tokens that followed the latest earlier occurrence of the context's last n
    tokens, trying n = max_ngram down to min_ngram; [] when nothing matches."""
    for n in range(max_ngram, min_ngram - 1, -1):
        if len(context) <= n:
            continue
        tail = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):  # latest occurrence before the tail itself
            if context[start : start + n] == tail:
                return context[start + n : start + n + steps]
    return []


def lookup_cycles(prompt: list[int], output: list[int], steps: int, max_ngram: int = 3) -> int:
    """Verify steps that prompt-lookup decoding of `prompt` needs to emit `output` (the target's
    greedy tokens, the first one from the prefill): each cycle emits the accepted draft prefix plus
    the target's own next token."""
    context = list(prompt) + output[:1]
    i, cycles = 1, 0
    while i < len(output):
        draft = lookup_draft(context, steps, max_ngram)
        a = 0
        while a < len(draft) and i + a < len(output) and draft[a] == output[i + a]:
            a += 1
        emitted = min(a + 1, len(output) - i)
        context += output[i : i + emitted]
        i += emitted
        cycles += 1
    return cycles


def lookup_acceptance(prompts: list[list[int]], outputs: list[list[int]], steps: int, max_ngram: int = 3) -> dict:
    """Acceptance length as the contract defines it (sum of completion tokens / sum of verify
    steps) of prompt-lookup decoding with `steps` draft tokens, over prompts and their greedy outputs."""
    if len(prompts) != len(outputs):
        raise ValueError(f"{len(prompts)} prompts but {len(outputs)} outputs")
    tokens = sum(len(o) for o in outputs)
    cycles = sum(lookup_cycles(p, o, steps, max_ngram) for p, o in zip(prompts, outputs))
    return {
        "drafter": f"prompt lookup (n <= {max_ngram})",
        "steps": steps,
        "samples": len(prompts),
        "completion_tokens": tokens,
        "verify_steps": cycles,
        "acceptance_length": acceptance_length(tokens, cycles),
    }
