"""Text helpers of the blend: exact and near (MinHash) dedup, token counts, decontamination, splits.

Each is a small object the pipeline feeds rows through; kept apart so they can be tested and
benchmarked alone (blend.bench).
"""

from __future__ import annotations

import hashlib
import zlib

import numpy as np

from draftlab.blend.spec import SPLITS
from draftlab.core.progress import tqdm

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


_MASK32 = np.uint64(0xFFFFFFFF)
_MULTS = np.array(
    [0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, 0x165667B1, 0xD3A2646C, 0xFD7046C5, 0xB55A4F09], dtype=np.uint64
)


class NearDuplicates:
    """MinHash-LSH index over word shingles (datasketch): `seen(text)` is True for a near-duplicate.

    Shingle hashes are computed with numpy from per-word CRC32 values (cached per word), which
    is several times faster than hashing joined shingle strings and just as deterministic.
    """

    def __init__(self, threshold: float = 0.8, num_perm: int = 64, shingle: int = 5):
        from datasketch import MinHash, MinHashLSH

        if shingle > len(_MULTS):
            raise ValueError(f"shingle size {shingle} > {len(_MULTS)}")
        self._MinHash = MinHash
        self.num_perm, self.shingle = num_perm, shingle
        self.permutations = MinHash(num_perm=num_perm, seed=1).permutations
        self.lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
        self._word_hash: dict[str, int] = {}

    def signature(self, text: str):
        words = text.lower().split()
        if not words:
            return None
        cache = self._word_hash
        hashes = [cache.get(w) for w in words]
        for j, h in enumerate(hashes):
            if h is None:
                hashes[j] = cache[words[j]] = zlib.crc32(words[j].encode("utf-8", "surrogatepass"))
        hv = np.asarray(hashes, dtype=np.uint64)
        k = min(self.shingle, len(hv))
        n = len(hv) - k + 1
        acc = np.zeros(n, dtype=np.uint64)
        for j in range(k):  # polynomial combination of k consecutive word hashes (mod 2**64, then 32 bits)
            acc = acc * _MULTS[j] + hv[j : j + n]
        shingles = np.unique(acc & _MASK32).tolist()
        m = self._MinHash(num_perm=self.num_perm, permutations=self.permutations, hashfunc=int, scheme="affine32")
        m.update_batch(shingles)
        return m

    def check_and_add(self, key: str, text: str) -> str | None:
        """The key of an earlier near-duplicate, or None after adding this text to the index."""
        return self.add(key, self.signature(text))

    def add(self, key: str, m) -> str | None:
        """Like `check_and_add` for a signature computed beforehand."""
        if m is None:
            return None
        hits = self.lsh.query(m)
        if hits:
            return sorted(hits)[0]
        self.lsh.insert(key, m)
        return None


class Contamination:
    """Word n-gram overlap with evaluation texts (the usual 13-gram test)."""

    def __init__(self, eval_texts: dict[str, list[str]], n: int = 13):
        self.n = n
        self.grams: dict[str, set] = {}
        for name, texts in eval_texts.items():
            grams: set = set()
            for text in texts:
                words = text.lower().split()
                grams.update(zip(*(words[i:] for i in range(n))))
            self.grams[name] = grams

    def hit(self, text: str) -> str | None:
        words = text.lower().split()
        if len(words) < self.n:
            return None
        for name, grams in self.grams.items():
            if not grams.isdisjoint(zip(*(words[i:] for i in range(self.n)))):
                return name
        return None

    @property
    def sizes(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.grams.items()}


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
