"""Text overlap, one rule each: word n-grams (the usual 13-gram decontamination test) and MinHash
near-duplicates of word shingles. The blend dedups and decontaminates with them, the evaluation
suite and the generated prompts decontaminate against every evaluation set with them.
"""

from __future__ import annotations

import zlib

import numpy as np

__all__ = ["Contamination", "EvalIndex", "NearDuplicates", "word_ngrams"]


def word_ngrams(text: str, n: int):
    """The n-grams of lower-cased whitespace words (none when the text has fewer than n words)."""
    words = text.lower().split()
    return zip(*(words[i:] for i in range(n)))


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
                grams.update(word_ngrams(text, n))
            self.grams[name] = grams

    def hit(self, text: str) -> str | None:
        """The name of the first evaluation set `text` shares an n-gram with, or None."""
        grams = set(word_ngrams(text, self.n))
        for name, eval_grams in self.grams.items():
            if not eval_grams.isdisjoint(grams):
                return name
        return None

    @property
    def sizes(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.grams.items()}


class EvalIndex:
    """Which indexed texts a text overlaps: a shared word n-gram, or a near-duplicate (MinHash of word
    shingles, Jaccard >= `threshold`). Built from the evaluation side (a few hundred prompts), so a large
    training file streams through `hits` one row at a time."""

    def __init__(self, items: dict[str, str] | None = None, n: int = 13, threshold: float = 0.8, shingle: int = 5):
        self.n = n
        self.grams: dict[tuple, set[str]] = {}
        self.index = NearDuplicates(threshold=threshold, shingle=shingle)
        for key, text in (items or {}).items():
            self.add(key, text)

    def signature(self, text: str):
        return self.index.signature(text)

    def add(self, key: str, text: str, signature=None) -> None:
        for gram in word_ngrams(text, self.n):
            self.grams.setdefault(gram, set()).add(key)
        signature = signature if signature is not None else self.signature(text)
        if signature is not None:
            self.index.lsh.insert(key, signature)

    def ngram_hits(self, text: str) -> set[str]:
        found: set[str] = set()
        for gram in word_ngrams(text, self.n):
            found |= self.grams.get(gram, set())
        return found

    def near(self, text: str, signature=None) -> set[str]:
        signature = signature if signature is not None else self.signature(text)
        return set(self.index.lsh.query(signature)) if signature is not None else set()

    def hits(self, text: str, near_text: str | None = None) -> set[str]:
        """Keys of the indexed texts that `text` shares an n-gram with, or that `near_text` (default:
        `text`) near-duplicates."""
        return self.ngram_hits(text) | self.near(text if near_text is None else near_text)
