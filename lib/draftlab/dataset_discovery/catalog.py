"""Dataset discovery: the catalog snapshot, live Hub search, and a scoring with reasons.

`data/catalog.yaml` records what a manual Hub search found (license, size, schema family...).
`discover` asks the Hub for more (keyword search sorted by downloads, card metadata) when it is
reachable, and says plainly that it is using the snapshot when it is not; the probe fails in
seconds, so an offline machine never hangs. `score` ranks candidates for a workload and keeps
the reason behind every point.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from draftlab.core.paths import repo_path, repo_root
from draftlab.dataset_discovery.sources import ADAPTERS_BY_NAME

CATEGORIES = (
    "large-scale code instruction",
    "Alpaca-style",
    "conversational/multi-turn code",
    "commit/edit",
    "composite (OpenCoder-style)",
    "agentic coding",
    "reasoning",
    "general chat",
)
REQUIRED_FIELDS = ("hub_id", "name", "category", "rows", "schema", "license", "languages", "turns", "note")
PERMISSIVE = {"apache-2.0", "mit", "cc-by-4.0", "bsd-3-clause", "bsd-2-clause", "cc0-1.0", "odc-by", "cc-by-sa-4.0"}
NON_COMMERCIAL = ("-nc", "noncommercial", "non-commercial", "research-only")
DEFAULT_KEYWORDS = ("code instruct", "code feedback", "code alpaca", "sharegpt", "agent trajectories", "commitpack")

# How relevant each category is to a workload (0..3), with the reason shown to the user.
RELEVANCE = {
    "code": {
        "large-scale code instruction": 3,
        "conversational/multi-turn code": 3,
        "Alpaca-style": 2,
        "composite (OpenCoder-style)": 2,
        "commit/edit": 2,
        "agentic coding": 2,
        "reasoning": 1,
        "general chat": 0,
    },
    "agentic": {
        "agentic coding": 3,
        "conversational/multi-turn code": 2,
        "large-scale code instruction": 2,
        "commit/edit": 2,
        "composite (OpenCoder-style)": 1,
        "Alpaca-style": 1,
        "reasoning": 1,
        "general chat": 0,
    },
    "chat": {
        "general chat": 3,
        "conversational/multi-turn code": 2,
        "reasoning": 1,
        "large-scale code instruction": 1,
        "composite (OpenCoder-style)": 1,
        "Alpaca-style": 1,
        "commit/edit": 0,
        "agentic coding": 0,
    },
    "reasoning": {
        "reasoning": 3,
        "large-scale code instruction": 1,
        "conversational/multi-turn code": 1,
        "general chat": 1,
        "composite (OpenCoder-style)": 1,
        "Alpaca-style": 0,
        "commit/edit": 0,
        "agentic coding": 1,
    },
}


class CatalogError(ValueError):
    """The catalog file is malformed; the message names the file, entry and field."""


def default_catalog_path() -> Path:
    root = repo_root()
    if root is None:
        raise FileNotFoundError("data/catalog.yaml lives in the repository checkout; pass a path")
    return root / "data" / "catalog.yaml"


def load_catalog(path: str | Path | None = None) -> list[dict]:
    """Entries of the catalog snapshot, checked: every field present, `unknown` where unverified."""
    if path is None:
        path = default_catalog_path()
    else:
        path = repo_path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path}: not valid YAML ({exc})") from None
    entries = data.get("datasets") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise CatalogError(f"{path}: expected a top-level 'datasets' list")
    seen = set()
    for i, entry in enumerate(entries):
        where = f"{path}: datasets[{i}]"
        if not isinstance(entry, dict):
            raise CatalogError(f"{where} is not a mapping")
        missing = [f for f in REQUIRED_FIELDS if f not in entry]
        if missing:
            raise CatalogError(
                f"{where} ({entry.get('hub_id', '?')}): missing field(s) {missing}; write 'unknown' "
                f"where a fact could not be verified"
            )
        if entry["category"] not in CATEGORIES and entry["category"] != "discovered":
            raise CatalogError(
                f"{where} ({entry['hub_id']}): category {entry['category']!r} is not one of {CATEGORIES}"
            )
        if entry["schema"] != "unknown" and entry["schema"] not in ADAPTERS_BY_NAME:
            raise CatalogError(
                f"{where} ({entry['hub_id']}): schema {entry['schema']!r} has no adapter; "
                f"known: {sorted(ADAPTERS_BY_NAME)} or 'unknown'"
            )
        if entry["turns"] not in ("single", "multi", "unknown"):
            raise CatalogError(f"{where} ({entry['hub_id']}): turns must be single, multi or unknown")
        if entry["rows"] != "unknown" and not isinstance(entry["rows"], int):
            raise CatalogError(f"{where} ({entry['hub_id']}): rows must be an integer or 'unknown'")
        if entry["hub_id"] in seen:
            raise CatalogError(f"{where}: duplicate hub_id {entry['hub_id']!r}")
        seen.add(entry["hub_id"])
    return [dict(e) for e in entries]


# --------------------------------------------------------------------------------- discovery


@dataclass
class Discovery:
    """What live discovery found, and a plain sentence saying where the facts came from."""

    online: bool
    message: str
    found: list[dict] = field(default_factory=list)


def hub_reachable(timeout_s: float = 3.0) -> tuple[bool, str]:
    """(reachable, why not): honours HF_HUB_OFFLINE and fails within `timeout_s` when offline."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return False, "HF_HUB_OFFLINE is set"
    import httpx

    url = f"{constants.ENDPOINT}/api/datasets?limit=1"
    try:
        response = httpx.get(url, timeout=timeout_s)
        response.raise_for_status()
    except Exception as exc:  # DNS failure, refused, timeout, HTTP error: all mean "use the snapshot"
        return False, f"{constants.ENDPOINT} did not answer ({type(exc).__name__}: {str(exc)[:120]})"
    return True, ""


def _tag_values(tags: list[str] | None, prefix: str) -> list[str]:
    return [t.split(":", 1)[1] for t in (tags or []) if t.startswith(prefix + ":")]


def hub_entry(info) -> dict:
    """A catalog-shaped dict from a huggingface_hub DatasetInfo (card metadata and tags)."""
    card = getattr(info, "card_data", None)
    card = card.to_dict() if hasattr(card, "to_dict") else (card or {})
    tags = list(getattr(info, "tags", None) or [])
    license_ = card.get("license") or (_tag_values(tags, "license") or ["unknown"])[0]
    if isinstance(license_, list):
        license_ = license_[0] if license_ else "unknown"
    sizes = card.get("size_categories") or _tag_values(tags, "size_categories")
    languages = card.get("language") or _tag_values(tags, "language") or ["unknown"]
    return {
        "hub_id": info.id,
        "downloads": getattr(info, "downloads", None),
        "likes": getattr(info, "likes", None),
        "license_card": license_,
        "size_category": (sizes[0] if isinstance(sizes, list) and sizes else sizes) or "unknown",
        "languages_card": languages if isinstance(languages, list) else [languages],
        "tags": tags,
        "last_modified": str(getattr(info, "last_modified", "") or ""),
    }


def discover(keywords=DEFAULT_KEYWORDS, limit: int = 20, timeout_s: float = 3.0, api=None) -> Discovery:
    """Search the Hub by keyword (sorted by downloads) and read card metadata; snapshot if offline."""
    if api is None:
        ok, why = hub_reachable(timeout_s)
        if not ok:
            return Discovery(
                False,
                f"The Hugging Face Hub is not reachable ({why}): using the catalog snapshot "
                f"(data/catalog.yaml) as it is.",
            )
        from huggingface_hub import HfApi

        api = HfApi()
    found: dict[str, dict] = {}
    try:
        for keyword in keywords:
            for info in api.list_datasets(search=keyword, sort="downloads", limit=limit, full=True):
                entry = hub_entry(info)
                entry["keyword"] = keyword
                found.setdefault(entry["hub_id"], entry)
    except Exception as exc:
        return Discovery(
            False,
            f"Hub search failed ({type(exc).__name__}: {str(exc)[:120]}): using the catalog "
            f"snapshot (data/catalog.yaml) as it is.",
            list(found.values()),
        )
    return Discovery(
        True, f"Live Hub search: {len(found)} datasets for {len(keywords)} keywords.", list(found.values())
    )


def enrich(catalog: list[dict], discovery: Discovery) -> list[dict]:
    """Catalog entries with live downloads/likes/card license added; new Hub finds appended as 'discovered'."""
    by_id = {e["hub_id"]: dict(e) for e in catalog}
    for hit in discovery.found:
        entry = by_id.get(hit["hub_id"])
        if entry is not None:
            entry.update({k: hit[k] for k in ("downloads", "likes", "license_card", "last_modified")})
            if entry.get("license") == "unknown" and hit["license_card"] != "unknown":
                entry["license"] = hit["license_card"]
                entry["note"] = f"{entry['note']} (license from the live card)"
        else:
            by_id[hit["hub_id"]] = {
                "hub_id": hit["hub_id"],
                "name": hit["hub_id"].split("/")[-1],
                "category": "discovered",
                "rows": "unknown",
                "size_category": hit["size_category"],
                "schema": "unknown",
                "license": hit["license_card"],
                "languages": hit["languages_card"],
                "turns": "unknown",
                "note": f"found by live search for {hit['keyword']!r}; columns not inspected",
                "downloads": hit["downloads"],
                "likes": hit["likes"],
            }
    return list(by_id.values())


# ----------------------------------------------------------------------------------- scoring


@dataclass(frozen=True)
class Workload:
    """What the draft will serve: domain, whether it is multi-turn, and licensing needs."""

    domain: str = "code"
    multi_turn: bool = True
    commercial: bool = True
    min_rows: int = 10_000


def _rows_estimate(entry: dict) -> int | None:
    if isinstance(entry.get("rows"), int):
        return entry["rows"]
    size = str(entry.get("size_category", ""))
    for token, value in (
        ("n<1K", 500),
        ("1K<n<10K", 5_000),
        ("10K<n<100K", 50_000),
        ("100K<n<1M", 500_000),
        ("1M<n<10M", 5_000_000),
        ("n>1T", 10**12),
    ):
        if token in size:
            return value
    return None


def score_entry(entry: dict, workload: Workload = Workload()) -> tuple[float, list[str]]:
    """A score and the reason behind each of its parts."""
    reasons: list[str] = []
    total = 0.0
    lic = str(entry.get("license", "unknown")).lower()
    if lic == "unknown":
        reasons.append("license 0: not verified, read the card")
    elif any(tag in lic for tag in NON_COMMERCIAL):
        pts = -5 if workload.commercial else 0
        total += pts
        reasons.append(f"license {pts:+d}: {lic} is non-commercial")
    elif lic in PERMISSIVE:
        total += 3
        reasons.append(f"license +3: {lic} is permissive")
    else:
        total += 1
        reasons.append(f"license +1: {lic}, check its terms")
    rows = _rows_estimate(entry)
    if rows is None:
        reasons.append("size 0: unknown")
    else:
        pts = round(min(3.0, max(0.0, math.log10(max(rows, 1) / workload.min_rows) + 1)), 1)
        total += pts
        reasons.append(f"size {pts:+.1f}: ~{rows:,} rows")
    schema = entry.get("schema", "unknown")
    if schema in ADAPTERS_BY_NAME:
        total += 2
        reasons.append(f"format +2: read by the {schema} adapter")
    else:
        total -= 2
        reasons.append("format -2: no adapter known; columns must be inspected")
    turns = entry.get("turns", "unknown")
    if workload.multi_turn and turns == "multi":
        total += 1.5
        reasons.append("turns +1.5: multi-turn, like the workload")
    elif workload.multi_turn and turns == "single":
        reasons.append("turns 0: single-turn only")
    relevance = RELEVANCE.get(workload.domain, RELEVANCE["code"]).get(entry.get("category"), 0)
    total += 1.5 * relevance
    reasons.append(f"domain {1.5 * relevance:+.1f}: {entry.get('category')} for a {workload.domain} workload")
    return round(total, 2), reasons


def score(entries: list[dict], workload: Workload = Workload()):
    """A pandas table of candidates ranked by score, with reasons."""
    import pandas as pd

    rows = []
    for e in entries:
        s, reasons = score_entry(e, workload)
        rows.append(
            {
                "hub_id": e["hub_id"],
                "category": e["category"],
                "score": s,
                "license": e["license"],
                "rows": e["rows"] if e["rows"] != "unknown" else e.get("size_category", "unknown"),
                "schema": e["schema"],
                "turns": e["turns"],
                "reasons": "; ".join(reasons),
            }
        )
    df = pd.DataFrame(rows)
    return df.sort_values(["score", "hub_id"], ascending=[False, True]).reset_index(drop=True)


def plot_scores(table):
    """Horizontal bars of the scores, coloured by category."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    cats = list(dict.fromkeys(table["category"]))
    cmap = plt.get_cmap("tab10")
    colors = [cmap(cats.index(c) % 10) for c in table["category"]]
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(table) + 1.5))
    ax.barh(table["hub_id"][::-1], table["score"][::-1], color=colors[::-1])
    ax.set_xlabel("score (license + size + format + turns + domain)")
    ax.set_title("candidate datasets for the workload")
    ax.legend(handles=[Patch(color=cmap(i % 10), label=c) for i, c in enumerate(cats)], fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def catalog_json(entries: list[dict]) -> str:
    return json.dumps(entries, indent=2, default=str)
