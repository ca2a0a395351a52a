"""Conversations -> token ids + assistant-only loss masks, with the target's own chat template.

Many templates (SmolLM2's included) have no `{% generation %}` block, so transformers'
`return_assistant_tokens_mask` gives zeros; draftlab finds each assistant span by rendering the
conversation prefix with the generation prompt (where the reply starts) and the prefix including
the reply (where it ends), then marks the tokens whose characters overlap the span. The span runs
up to and including the end-of-turn token (the draft must learn to predict it), not the newline
some templates write after it.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from draftlab.core.process import die_with_parent, usable_cpus
from draftlab.core.progress import tqdm
from draftlab.core.records import RecordError, read_jsonl, validate_conversation, write_jsonl
from draftlab.model.target import render_chat

OVERLONG_POLICIES = ("truncate", "drop")
CHUNK_ROWS = 512  # conversations a tokenising worker takes at a time
PARALLEL_MIN_ROWS = 4 * CHUNK_ROWS  # below this one process: a pool's start costs more than it saves
MAX_WORKERS = 16


@dataclass
class TokenStats:
    """What happened to the rows of one file (reported, never silent)."""

    rows: int = 0
    kept: int = 0
    truncated: int = 0
    dropped_overlong: int = 0
    dropped_no_assistant: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    notes: list = field(default_factory=list)


_EOT_CACHE: dict = {}


def end_of_turn_strings(tokenizer) -> list[str]:
    """Strings that close an assistant turn: eos plus <|im_end|> / <|eot_id|> / <end_of_turn> if known."""
    key = (id(tokenizer), tokenizer.eos_token)
    if key not in _EOT_CACHE:
        vocab = tokenizer.get_vocab()  # slow (builds a dict of the whole vocabulary): once per tokenizer
        out = [tokenizer.eos_token] if tokenizer.eos_token else []
        out += [s for s in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>") if s in vocab and s not in out]
        _EOT_CACHE[key] = out
    return _EOT_CACHE[key]


def assistant_spans(tokenizer, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """(full text, [(start, end) character spans of each assistant reply incl. its end-of-turn])."""
    full = render_chat(tokenizer, messages, False)
    eots = end_of_turn_strings(tokenizer)
    spans = []
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        head = render_chat(tokenizer, messages[:i], True) if i else ""
        upto = render_chat(tokenizer, messages[: i + 1], False)
        if not full.startswith(head) or not full.startswith(upto) or len(upto) < len(head):
            # Templates that rewrite earlier turns: fall back to locating the content itself.
            start = full.find(msg["content"], spans[-1][1] if spans else 0)
            if start < 0:
                raise ValueError(f"messages[{i}]: assistant content not found in the rendered template")
            seg_start, seg_end = start, len(full)
        else:
            seg_start, seg_end = len(head), len(upto)
        segment = full[seg_start:seg_end]
        cut = -1
        content_end = segment.find(msg["content"]) + len(msg["content"]) if msg["content"] else 0
        for eot in eots:
            j = segment.find(eot, max(content_end, 0))
            if j >= 0 and (cut < 0 or j + len(eot) < cut):
                cut = j + len(eot)
        end = seg_start + cut if cut >= 0 else seg_start + len(segment.rstrip())
        spans.append((seg_start, end))
    return full, spans


def tokenize_conversation(tokenizer, messages: list[dict], max_len: int, overlong: str = "truncate"):
    """-> (input_ids, loss_mask, status) with status in {"ok", "truncated", "overlong", "no_assistant"}.

    loss_mask[j] = 1 when token j belongs to an assistant reply (it is a token the draft must predict).
    """
    if overlong not in OVERLONG_POLICIES:
        raise ValueError(f"overlong = {overlong!r}, expected one of {OVERLONG_POLICIES}")
    text, spans = assistant_spans(tokenizer, messages)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    mask = [0] * len(ids)
    k = 0
    for j, (s, e) in enumerate(offsets):
        while k < len(spans) and spans[k][1] <= s:
            k += 1
        if k < len(spans) and e > spans[k][0] and s < spans[k][1] and e > s:
            mask[j] = 1
    status = "ok"
    if len(ids) > max_len:
        if overlong == "drop":
            return None, None, "overlong"
        ids, mask, status = ids[:max_len], mask[:max_len], "truncated"
    if sum(mask[1:]) == 0:  # nothing to predict (token 0 is never a prediction target)
        return None, None, "no_assistant"
    return ids, mask, status


def tokenize_rows(
    rows,
    tokenizer,
    max_len: int,
    overlong: str = "truncate",
    where: str = "",
    limit: int | None = None,
    first_row: int = 1,
    progress: bool = True,
):
    """Tokenise canonical conversations -> (list of {"id", "input_ids", "loss_mask"}, TokenStats).
    `first_row`: the file's row number of rows[0], for error messages (a worker's chunk starts mid-file)."""
    stats = TokenStats()
    out = []
    bar = tqdm(rows, desc=f"tokenise {Path(where).name or 'rows'}", unit="conv", leave=False, disable=not progress)
    for n, row in enumerate(bar, first_row):
        if limit is not None and stats.kept >= limit:
            break
        stats.rows += 1
        validate_conversation(row, f"{where}: row {n}")
        try:
            ids, mask, status = tokenize_conversation(tokenizer, row["messages"], max_len, overlong)
        except ValueError as exc:
            raise RecordError(f"{where}: row {n} (id {row.get('id')}): field messages: {exc}") from exc
        if status == "overlong":
            stats.dropped_overlong += 1
            continue
        if status == "no_assistant":
            stats.dropped_no_assistant += 1
            continue
        stats.truncated += status == "truncated"
        stats.kept += 1
        stats.tokens += len(ids)
        stats.loss_tokens += sum(mask)
        out.append({"id": row["id"], "input_ids": ids, "loss_mask": mask})
    return out, stats


def tokenize_workers() -> int:
    """Processes to tokenise a large file with: the CPUs this process may use, where workers can be forked
    (they inherit the tokenizer; a spawned one would have to load it again)."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return max(1, min(MAX_WORKERS, usable_cpus()))


_WORKER: dict = {}  # in a tokenising worker: the tokenizer and options its chunks share


def _start_worker(tokenizer, max_len: int, overlong: str, where: str) -> None:
    die_with_parent()  # else a killed parent leaves its workers waiting on the task queue for good
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker, and no fork warning from tokenizers
    _WORKER.update(tokenizer=tokenizer, max_len=max_len, overlong=overlong, where=where)


def _tokenize_chunk(chunk: tuple[int, list]) -> tuple[list, TokenStats]:
    first_row, rows = chunk
    w = _WORKER
    return tokenize_rows(rows, w["tokenizer"], w["max_len"], w["overlong"], w["where"], None, first_row, False)


def tokenize_rows_parallel(rows: list, tokenizer, max_len: int, overlong: str, where: str, workers: int):
    """tokenize_rows over chunks of CHUNK_ROWS in `workers` forked processes: the same rows in the same
    order and the same stats (43,224 conversations took ~50 s in one process on the H200 machine).
    A bad row raises the first worker error in file order, naming its file row."""
    chunks = [(1 + i, rows[i : i + CHUNK_ROWS]) for i in range(0, len(rows), CHUNK_ROWS)]
    out, stats = [], TokenStats()
    context = multiprocessing.get_context("fork")
    init = (tokenizer, max_len, overlong, where)
    bar = tqdm(
        total=len(rows), desc=f"tokenise {Path(where).name or 'rows'} ({workers} procs)", unit="conv", leave=False
    )
    with bar, ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker, initargs=init) as pool:
        # map yields in order; leaving it early (a bad row, an interrupt) cancels the chunks not started yet
        for (_, chunk_rows), (kept, part) in zip(chunks, pool.map(_tokenize_chunk, chunks)):
            out += kept
            for name, value in asdict(part).items():
                setattr(stats, name, getattr(stats, name) + value)
            bar.update(len(chunk_rows))
    return out, stats


def _cache_key(path: Path, tokenizer, max_len: int, overlong: str, limit) -> str:
    st = path.stat()
    h = hashlib.sha256()
    h.update(
        json.dumps(
            [
                str(path.resolve()),
                st.st_size,
                st.st_mtime_ns,
                max_len,
                overlong,
                limit,
                tokenizer.name_or_path,
                len(tokenizer),
                tokenizer.chat_template or "",
            ]
        ).encode()
    )
    return h.hexdigest()[:16]


def load_tokenized(
    path,
    tokenizer,
    max_len: int,
    overlong: str = "truncate",
    cache_dir=None,
    limit: int | None = None,
    workers: int | None = None,
):
    """Tokenise a canonical JSONL file, cached as a `datasets` Arrow folder under cache_dir. A whole file
    of PARALLEL_MIN_ROWS rows or more is tokenised by `workers` processes (default: tokenize_workers()).

    Returns (datasets.Dataset with columns id, input_ids, loss_mask; TokenStats as a dict).
    """
    import datasets

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; run notebook 03_regenerate first (it writes data/regen/)")
    cache = None
    if cache_dir is not None:
        cache = Path(cache_dir) / f"{path.stem}-{_cache_key(path, tokenizer, max_len, overlong, limit)}"
        if (cache / "stats.json").is_file():
            return datasets.load_from_disk(str(cache / "data")), json.loads((cache / "stats.json").read_text())
    workers = tokenize_workers() if workers is None else workers
    whole = limit is None and workers > 1  # with a limit, only the rows it needs are read
    rows = list(read_jsonl(path)) if whole else read_jsonl(path)
    if whole and len(rows) >= PARALLEL_MIN_ROWS:
        rows, stats = tokenize_rows_parallel(rows, tokenizer, max_len, overlong, str(path), workers)
    else:
        rows, stats = tokenize_rows(rows, tokenizer, max_len, overlong, where=str(path), limit=limit)
    if not rows:
        raise RecordError(f"{path}: no usable conversation ({asdict(stats)})")
    ds = datasets.Dataset.from_list(rows)
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        ds.save_to_disk(str(cache / "data"))
        ds = datasets.load_from_disk(str(cache / "data"))
        (cache / "stats.json").write_text(json.dumps(asdict(stats)))
    return ds, asdict(stats)


def split_holdout(train_path, n_val: int, out_dir, seed: int = 0):
    """No val.jsonl from stage 03: hold out n_val conversations of train.jsonl (by a seeded shuffle)
    into out_dir/{train,val}.jsonl, leaving the input untouched. Returns the two paths."""
    import random

    rows = list(read_jsonl(train_path))
    if len(rows) <= n_val:
        raise RecordError(f"{train_path}: {len(rows)} conversations, too few to hold out {n_val} for validation")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    val = set(order[:n_val])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "train.jsonl", (r for i, r in enumerate(rows) if i not in val))
    write_jsonl(out / "val.jsonl", (r for i, r in enumerate(rows) if i in val))
    return out / "train.jsonl", out / "val.jsonl"
