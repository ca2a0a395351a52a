"""Text helpers of the blend: exact and near (MinHash) dedup, token counts, decontamination, splits.

Each is a small object the pipeline feeds rows through; kept apart so they can be tested and
benchmarked alone (blend.bench).
"""

from __future__ import annotations

import hashlib

from draftlab.blend.spec import SPLITS
from draftlab.core.overlap import Contamination, NearDuplicates
from draftlab.core.progress import tqdm

__all__ = ["Contamination", "NearDuplicates", "TokenCounter", "dedup_text", "definition", "split_key", "split_of"]

# ------------------------------------------------------------------------------ text helpers


def dedup_text(conv: dict, which: str = "user") -> str:
    """The text compared for duplicates: user turns (what regeneration keeps) or every turn."""
    msgs = conv["messages"]
    if which == "user":
        return "\n".join(m["content"] for m in msgs if m["role"] == "user")
    return "\n".join(m["content"] for m in msgs)


class TokenCounter:
    """Token counts of whole conversations with the target tokenizer, batched and fast.

    Each message's content is encoded once (Rust tokenizer, both cores) and the chat
    template's wrapper tokens are added per turn (by role) plus the default system prompt some
    templates insert when a conversation has none, all measured once by rendering probe
    conversations: exact for templates with a constant per-turn wrapper (ChatML as in SmolLM2),
    within a few tokens otherwise. `tokenizer=None` counts
    whitespace-separated words instead (no target needed; an approximation, said so in reports).
    """

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer
        # template tokens: a wrapper per turn (its size depends on the role name), plus a fixed
        # part when the template inserts a default system prompt (SmolLM2 does)
        self.per_role = {"system": 0, "user": 0, "assistant": 0}
        self.default_system = 0
        self._backend = getattr(tokenizer, "backend_tokenizer", None) if tokenizer is not None else None
        if tokenizer is not None and getattr(tokenizer, "chat_template", None):
            self._measure_template()

    @property
    def name(self) -> str:
        return "whitespace-words" if self.tokenizer is None else str(getattr(self.tokenizer, "name_or_path", "?"))

    def encode_lengths(self, texts: list[str]) -> list[int]:
        if self.tokenizer is None:
            return [len(t.split()) for t in texts]
        if self._backend is not None:
            encode = getattr(self._backend, "encode_batch_fast", None) or self._backend.encode_batch
            return [len(e) for e in encode(texts, add_special_tokens=False)]
        return [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def _measure_template(self) -> None:
        def overhead(roles):
            msgs = [{"role": r, "content": f"probe text {i}"} for i, r in enumerate(roles)]
            text = self.tokenizer.apply_chat_template(msgs, tokenize=False)
            return self.encode_lengths([text])[0] - sum(self.encode_lengths([m["content"] for m in msgs]))

        u, ua, uau = overhead(["user"]), overhead(["user", "assistant"]), overhead(["user", "assistant", "user"])
        self.per_role["user"] = uau - ua
        self.per_role["assistant"] = ua - u
        self.default_system = max(u - self.per_role["user"], 0)
        self.per_role["system"] = overhead(["system", "user"]) - self.per_role["user"]

    def template_tokens(self, messages: list[dict]) -> int:
        has_system = bool(messages) and messages[0]["role"] == "system"
        return sum(self.per_role[m["role"]] for m in messages) + (0 if has_system else self.default_system)

    def count(self, conversations: list[dict], batch: int = 8192, progress: bool = False) -> list[int]:
        texts, owner = [], []
        for i, conv in enumerate(conversations):
            for m in conv["messages"]:
                texts.append(m["content"])
                owner.append(i)
        totals = [self.template_tokens(c["messages"]) for c in conversations]
        bar = _bar(len(texts), "tokens", progress)
        for start in range(0, len(texts), batch):
            lengths = self.encode_lengths(texts[start : start + batch])
            for j, n in enumerate(lengths):
                totals[owner[start + j]] += n
            bar.update(len(lengths))
        bar.close()
        return totals


def _bar(total: int, desc: str, enabled: bool):
    return tqdm(total=total, desc=desc, disable=not enabled, unit="row", mininterval=1.0)


def definition(conv: dict) -> str | None:
    """The documented definition a docstrings prompt was made from ('package:module:qualname'); None for
    other conversations."""
    meta = conv.get("meta") or {}
    return f"{meta.get('package')}:{meta.get('module')}:{meta['qualname']}" if "qualname" in meta else None


def split_key(conv: dict, split_by: str = "id") -> str:
    """What a conversation's split is drawn from: its id; with split_by "definition", the documented
    definition it was made from, so that a docstrings source's several prompts for one definition
    (`templates` > 1) share a split instead of letting training see a held-out prompt's siblings."""
    return (definition(conv) if split_by == "definition" else None) or conv["id"]


def split_of(conv_id: str, fractions: dict[str, float], salt: str = "draftlab") -> str:
    """Split by a hash of the id: the same conversation lands in the same split in every blend."""
    u = int.from_bytes(hashlib.blake2b(f"{salt}:{conv_id}".encode(), digest_size=8).digest(), "big") / 2**64
    acc = 0.0
    for name in SPLITS:
        acc += fractions.get(name, 0.0)
        if u < acc:
            return name
    return next(name for name in reversed(SPLITS) if fractions.get(name))  # float rounding at the top edge
