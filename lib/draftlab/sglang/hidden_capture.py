"""Hidden states of the training conversations, captured in SGLang, written as draftlab's offline store.

The job is engine-agnostic: an adapter turns (sample index, token ids) into (aux [n, 3H], final
[n, H]) in order (`hidden_server.SGLangCapture` runs SGLang; the tests use transformers). This
module decides which ids SGLang must capture, checks the disk before the first token, writes
`model.hidden`'s store (sharded safetensors + index.json, the same reader `draftlab train` uses),
resumes after its last finished shard, and on SIGTERM/SIGINT writes what it holds and stops.

The store's `last` is SGLang's final state after the target's final norm ("post_norm"), which is
what SGLang's EAGLE worker receives; training from it uses `head_target`, whose norm is already
applied.

A shard (about 1 GB) is written on a thread of its own while the next one fills: the adapter keeps
its requests in flight during the write instead of leaving SGLang idle, and each conversation's
states go to the file as they came (model.hidden.write_shard joins them).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import torch

from draftlab.core.errors import InputError, RunFailure
from draftlab.core.progress import tqdm
from draftlab.core.stop import graceful_stop
from draftlab.model.capture import CaptureError, config_ids, default_capture, is_deepseek, outside_target
from draftlab.model.hidden import (
    LAST_POST_NORM,
    STORE_KEYS,
    _ids_fingerprint,
    check_free_disk,
    estimate_bytes,
    open_store,
    samples_done,
    write_shard,
)
from draftlab.model.target import text_config

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def capture_plan(config: dict, layers=None) -> dict:
    """What SGLang must capture for a target config (config.json as a dict; no weights):
    {layers (hidden_states indices), config_ids (what an exported draft carries and SGLang's setter
    takes), deepseek, hidden_size, num_layers, width (3H), architectures}."""
    text = text_config(config)
    n, h = int(text["num_hidden_layers"]), int(text["hidden_size"])
    layers = [int(i) for i in (layers or default_capture(n))]
    deepseek = is_deepseek(text.get("model_type") or config.get("model_type"), config.get("architectures"))
    try:
        ids = config_ids(layers, deepseek)
    except CaptureError as exc:
        raise InputError(f"capture layers {layers}: {exc}") from exc
    if len(layers) != 3 or outside_target(ids, n, deepseek):
        raise InputError(f"capture layers {layers}: need 3 decoder-layer inputs within 1..{n - 1}")
    return {
        "layers": layers,
        "config_ids": ids,
        "deepseek": deepseek,
        "hidden_size": h,
        "num_layers": n,
        "width": 3 * h,
        "architectures": list(config.get("architectures") or []),
    }


def store_meta(dataset, plan: dict, target_name: str, dtype: torch.dtype) -> dict:
    """The store's identity (model.hidden.STORE_KEYS): what a restart must agree with to keep shards."""
    return {
        "layers": plan["layers"],
        "hidden_size": plan["hidden_size"],
        "store_aux": True,
        "dtype": str(dtype),
        "fingerprint": _ids_fingerprint(dataset),
        "num_samples": len(dataset),
        "target": str(target_name),
        "last": LAST_POST_NORM,
        "source": "sglang",
    }


def store_complete(out_dir, dataset, plan: dict, target_name: str, dtype: torch.dtype) -> bool:
    """True when out_dir already holds every sample of this job (nothing to start a server for)."""
    import json

    index = Path(out_dir) / "index.json"
    if not index.is_file():
        return False
    old, want = json.loads(index.read_text()), store_meta(dataset, plan, target_name, dtype)
    return all(old.get(k) == want[k] for k in STORE_KEYS) and samples_done(old) == len(dataset)


def capture_hidden(
    adapter,
    dataset,
    out_dir,
    plan: dict,
    target_name: str,
    dtype: torch.dtype = torch.bfloat16,
    shard_tokens: int = 1 << 20,
) -> dict:
    """Capture every sample of `dataset` (columns id, input_ids) through `adapter` into out_dir.

    Returns {samples, tokens, seconds, tok_s, bytes, resumed_from}. Raises RunFailure when the disk
    cannot hold the rest (before any work), core.stop.Stopped after a signal (shards kept)."""
    out = Path(out_dir)
    meta = open_store(out, store_meta(dataset, plan, target_name, dtype))
    done = samples_done(meta)
    lengths = [len(x) for x in dataset["input_ids"]]
    todo = sum(lengths[done:])
    need = estimate_bytes(todo, plan["hidden_size"], True, dtype)
    print(
        f"SGLang hidden states: {len(lengths)} conversations, {sum(lengths):,} tokens, capture layers "
        f"{plan['layers']} (config ids {plan['config_ids']}), {plan['width']} + {plan['hidden_size']} wide in "
        f"{dtype} -> {estimate_bytes(sum(lengths), plan['hidden_size'], True, dtype) / 1e9:.2f} GB in {out}; "
        f"{done} already done, {need / 1e9:.2f} GB to write",
        flush=True,
    )
    check_free_disk(out, need, "the SGLang hidden states", "free space, or another --out")
    t0, written = time.time(), 0
    if done < len(lengths):
        with graceful_stop("rerun the same command to resume") as stop:
            written = _run(adapter, dataset, out, meta, plan, dtype, shard_tokens, done, stop)
    seconds = time.time() - t0
    return {
        "samples": len(lengths),
        "tokens": sum(lengths),
        "captured_tokens": written,
        "seconds": seconds,
        "tok_s": written / seconds if seconds > 0 else None,
        "bytes": sum(f.stat().st_size for f in out.glob("shard-*.safetensors")),
        "resumed_from": done,
    }


def _check(k: int, sid, n: int, aux, final, plan: dict) -> None:
    h = plan["hidden_size"]
    if tuple(aux.shape) != (n, 3 * h) or tuple(final.shape) != (n, h):
        raise RunFailure(
            f"conversation {sid} (sample {k}): captured aux {tuple(aux.shape)}, final {tuple(final.shape)}; "
            f"expected [{n}, {3 * h}] and [{n}, {h}]"
        )


class ShardWriter:
    """One shard written at a time on a thread, beside the capture loop; its error comes back on the
    next submit or check. join() is safe in a finally (it never raises)."""

    def __init__(self):
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def _write(self, *args, **kw) -> None:
        try:
            write_shard(*args, **kw)
        except BaseException as exc:  # handed to the capture loop's thread
            self.error = exc

    def submit(self, *args, **kw) -> None:
        self.check()
        self.thread = threading.Thread(target=self._write, args=args, kwargs=kw, name="draftlab-shard")
        self.thread.start()

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None

    def check(self) -> None:
        self.join()
        if self.error is not None:
            error, self.error = self.error, None
            raise error


def _run(adapter, dataset, out: Path, meta: dict, plan: dict, dtype, shard_tokens: int, done: int, stop) -> int:
    """The capture loop from sample `done`; returns tokens written. A shard holds whole conversations."""
    ids_col, rows = dataset["id"], dataset["input_ids"]
    items = ((k, rows[k]) for k in range(done, len(rows)))
    bar = tqdm(total=sum(len(r) for r in rows[done:]), unit="tok", desc="SGLang hidden states")
    start, buf_aux, buf_last, buf_ids, buf_tok, written = done, [], [], [], 0, 0
    writer = ShardWriter()

    def flush(end: int) -> None:
        nonlocal start, buf_aux, buf_last, buf_ids, buf_tok
        if end > start:  # aux: [n_k, 3H] and last: [n_k, H] per conversation, joined by write_shard
            writer.submit(out, meta, {"aux": buf_aux, "last": buf_last}, start, end, ids=buf_ids)
        start, buf_aux, buf_last, buf_ids, buf_tok = end, [], [], [], 0

    try:
        with bar:
            for k, aux, final in adapter.states(items):
                n = len(rows[k])
                if k != start + len(buf_ids):
                    raise RunFailure(f"the capture adapter returned sample {k}, expected {start + len(buf_ids)}")
                _check(k, ids_col[k], n, aux, final, plan)
                buf_aux.append(aux.to("cpu", dtype))
                buf_last.append(final.to("cpu", dtype))
                buf_ids.append(ids_col[k])
                buf_tok += n
                written += n
                bar.update(n)
                if buf_tok >= shard_tokens:
                    flush(k + 1)
                if stop:
                    flush(k + 1)
                    writer.check()
                    stop.stopped(f"SGLang capture into {out} after {k + 1} of {len(rows)} conversations (saved)")
            flush(len(rows))
        writer.check()
    finally:
        writer.join()  # a shard being written is finished (and indexed) whatever stops the loop
    return written


def resolve_dtype(name) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise InputError(f"--dtype {name!r}: expected one of {sorted(DTYPES)}")
    return DTYPES[name]
