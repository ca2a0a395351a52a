"""The blend pipeline (notebook 02): sources -> filters -> dedup -> decontamination -> splits -> files.

`blend` writes train/val/test JSONL plus a rejects file and a report; every row keeps its
stable id, so later stages resume and dedup by id.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from draftlab.blend.spec import (
    EVAL_SETS,
    RULES,
    SPLITS,
    BlendSpecError,
    load_source,
    load_spec,
    quotas,
    refuse_empty,
    spec_sha256,
)
from draftlab.blend.text import (
    Contamination,
    NearDuplicates,
    TokenCounter,
    _bar,
    dedup_text,
    definition,
    split_key,
    split_of,
)
from draftlab.core.files import atomic_path, atomic_write_json
from draftlab.core.records import read_jsonl, write_jsonl
from draftlab.model.target import load_tokenizer

# --------------------------------------------------------------------------------- pipeline


@dataclass
class BlendResult:
    splits: dict[str, list[dict]]
    report: dict
    dropped: list[dict] = field(default_factory=list)


def _held_out(spec: dict, conversations: list[dict], against: list[str]) -> tuple[dict, Contamination]:
    """What decontamination compares against: {definition: eval source} and the 13-gram test.

    An eval source of this blend (another blend's held-out split) is matched by definition where its rows
    have one: its prompts share template sentences, whose 13-grams would drop every prompt of a template
    (59,363 of the large blend's; blend-offline-large.yaml); by 13-gram where they have none."""
    own = {name for name in against if name not in EVAL_SETS}
    held = {definition(c): c["source"] for c in conversations if c["source"] in own and definition(c)}
    eval_texts = spec.get("_eval_texts") or {
        name: EVAL_SETS[name]()
        if name in EVAL_SETS
        else [dedup_text(c, "all") for c in conversations if c["source"] == name and not definition(c)]
        for name in against
    }
    return held, Contamination(eval_texts, spec["decontaminate"]["ngram"])


def run_pipeline(
    conversations: list[dict],
    spec: dict,
    counter: TokenCounter,
    *,
    pinned: dict[str, str] | None = None,
    eval_sources: set[str] | None = None,
    quota: dict[str, int | None] | None = None,
    progress: bool = False,
) -> BlendResult:
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
        dropped.append(
            {
                "id": c["id"],
                "source": c["source"],
                "line": c["meta"].get("line"),
                "rule": rule,
                **({"detail": detail} if detail is not None else {}),
            }
        )

    t = time.perf_counter()
    if spec["dedup"]["exact"]:
        seen: dict[bytes, int] = {}
        keep = []
        for i in alive:
            key = hashlib.blake2b(
                dedup_text(conversations[i], field_).encode("utf-8", "surrogatepass"), digest_size=16
            ).digest()
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
    near = (
        NearDuplicates(spec["dedup"]["threshold"], spec["dedup"]["num_perm"], spec["dedup"]["shingle"])
        if spec["dedup"]["near"]
        else None
    )
    against = spec["decontaminate"]["against"] or []
    held, cont = _held_out(spec, conversations, against) if against else ({}, None)
    signatures, hits = {}, {}
    with ThreadPoolExecutor(max_workers=1) as pool:
        counting = pool.submit(counter.count, [conversations[i] for i in alive], progress=progress)
        bar = _bar(len(alive), "dedup/decontam", progress)
        for i in alive:
            c = conversations[i]
            if near is not None:
                signatures[i] = near.signature(dedup_text(c, field_))
            if cont is not None and c["source"] not in eval_sources:
                hits[i] = held.get(definition(c)) or cont.hit(dedup_text(c, "all"))
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
        split = pinned.get(c["source"]) or split_of(
            split_key(c, spec.get("split_by", "id")), spec["splits"], spec["split_salt"]
        )
        row = {
            "id": c["id"],
            "source": c["source"],
            "messages": c["messages"],
            "meta": {**c["meta"], "n_tokens": n_tokens[i], "split": split, "blend": spec.get("name")},
        }
        splits[split].append(row)
    for s, rows in splits.items():
        random.Random(f"{spec['seed']}:{s}").shuffle(rows)
    timings["select_split_shuffle"] = time.perf_counter() - t

    report = {
        "input_rows": len(conversations),
        "dropped": {r: drops.get(r, 0) for r in RULES},
        "splits": {s: len(v) for s, v in splits.items()},
        "shortfall": shortfall,
        "decontamination": {
            "against": against,
            "ngram": spec["decontaminate"]["ngram"],
            "eval_ngrams": eval_ngrams,
            "contaminated": dict(contamination_counts),
        },
        "tokenizer": {
            "name": counter.name,
            "template_tokens_per_role": counter.per_role,
            "template_default_system": counter.default_system,
            "approximate": counter.tokenizer is None,
        },
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
    }
    return BlendResult(splits=splits, report=report, dropped=dropped)


def length_stats(rows: list[dict], bins: list[int]) -> dict:
    lengths = np.array([r["meta"]["n_tokens"] for r in rows], dtype=np.int64)
    if len(lengths) == 0:
        return {"rows": 0, "histogram": [0] * (len(bins) - 1)}
    hist, _ = np.histogram(np.clip(lengths, bins[0], bins[-1] - 1), bins=bins)
    return {
        "rows": int(len(lengths)),
        "tokens": int(lengths.sum()),
        "mean": round(float(lengths.mean()), 1),
        "p50": int(np.percentile(lengths, 50)),
        "p95": int(np.percentile(lengths, 95)),
        "max": int(lengths.max()),
        "histogram": hist.tolist(),
    }


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
    return load_tokenizer(name)


def blend(
    spec_path: str | Path | dict,
    out_dir: str | Path,
    *,
    target: str | None = None,
    overrides: dict | None = None,
    source_overrides: dict | None = None,
    tokenizer=None,
    progress: bool = True,
) -> dict:
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
        infos.append(
            info
            | {
                "loaded": len(normalized.conversations) + len(normalized.rejects),
                "rejected": len(normalized.rejects),
                "quota": want[src["name"]],
            }
        )
        if progress:
            print(
                f"source {src['name']}: {len(normalized.conversations)} rows, {len(normalized.rejects)} rejected"
                + (" (cached)" if info.get("cached") else "")
            )
    load_s = time.perf_counter() - t
    result = run_pipeline(
        conversations,
        spec,
        counter,
        pinned={s["name"]: s["pin_split"] for s in spec["sources"] if s.get("pin_split")},
        eval_sources={s["name"] for s in spec["sources"] if s.get("eval")},
        quota=want,
        progress=progress,
    )
    refuse_empty(result.splits, result.dropped, len(conversations), len(rejects), spec_path)
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
        "rejected_sources": [
            {"source": i["name"], "reason": i["rejected_source"]} for i in infos if i.get("rejected_source")
        ],
        "rejects_by_reason": dict(Counter(_reason_kind(r["reason"]) for r in rejects).most_common()),
        "length_bins": bins,
        "length": {s: length_stats(rows, bins) for s, rows in result.splits.items()},
        "length_by_source": {
            src: length_stats([r for rows in result.splits.values() for r in rows if r["source"] == src], bins)
            for src in per_source
        },
        "versions": _versions(),
    }
    report["timings_s"] = {
        "load": round(load_s, 3),
        **report["timings_s"],
        "write": round(write_s, 3),
        "total": round(time.perf_counter() - t0, 3),
    }
    atomic_write_json(out / "report.json", report, indent=2, default=str)
    return report


def _reason_kind(reason: str) -> str:
    """Group reject reasons for the report ('missing field', 'empty content', ...)."""
    for kind in (
        "empty source",
        "missing field",
        "not str",
        "empty content",
        "unknown role",
        "invalid UTF-8",
        "absurd length",
        "not valid JSON",
        "no user message",
        "not a list",
        "not an object",
        "has no",
    ):
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

    schema = pa.schema(
        [
            ("id", pa.string()),
            ("source", pa.string()),
            ("split", pa.string()),
            ("n_tokens", pa.int32()),
            ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            ("meta", pa.string()),
        ]
    )
    table = pa.Table.from_pylist(
        [
            {
                "id": r["id"],
                "source": r["source"],
                "split": r["meta"].get("split"),
                "n_tokens": r["meta"].get("n_tokens"),
                "messages": r["messages"],
                "meta": json.dumps(r["meta"], ensure_ascii=False),
            }
            for r in rows
        ],
        schema=schema,
    )
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


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
