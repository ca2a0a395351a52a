"""Target hidden states for draft training and drafting.

"Input of layer i" = transformers' `hidden_states[i]` (index 0 = embedding output): the indices
draftlab trains on (SGLang's config ids are these minus one; see draftlab.model.export). The final state
for the EAGLE-1-style variant and for `--speculative-algorithm EAGLE` is the target's last hidden
state *after* its final norm, as SGLang's EAGLE worker receives it (and as transformers'
`hidden_states[-1]`); the pre-norm state is kept as well because target logits are computed from it.
"""

from __future__ import annotations

import shutil

import torch

from draftlab.core.errors import RunFailure
from draftlab.core.files import atomic_path, atomic_write_json
from draftlab.core.progress import tqdm
from draftlab.model.target import text_config


def _final_norm(model):
    """The target's final RMSNorm (Llama-like models keep it at base_model.norm)."""
    base = getattr(model, "base_model", model)
    norm = getattr(base, "norm", None)
    if norm is None:
        raise ValueError(f"{type(model).__name__}: no final norm at base_model.norm; unsupported target architecture")
    return norm


def _check_layers(layers, num_layers: int):
    if len(layers) != 3:
        raise ValueError(f"capture layers must be 3 ids, got {list(layers)}")
    for i in layers:
        if not 0 <= int(i) < num_layers:
            raise ValueError(f"capture layer {i} outside 0..{num_layers - 1} (input-of-layer ids)")


@torch.no_grad()
def target_states(target, input_ids, attention_mask=None, layers=None, want_logits: bool = False):
    """One target forward: (aux [B,T,3H], last [B,T,H] pre-norm, logits [B,T,V] or None).

    `target` is a draftlab Target (or anything with .model); layers default to
    target.capture_layers.
    """
    model = target.model if hasattr(target, "model") else target
    layers = list(layers if layers is not None else target.capture_layers)
    n = text_config(model.config).num_hidden_layers
    _check_layers(layers, n)
    device = next(model.parameters()).device
    input_ids = input_ids.to(device)
    if attention_mask is not None:
        attention_mask = attention_mask.to(device)
    # The pre-norm output of the last layer: hidden_states[-1] is post-norm in transformers.
    captured = {}
    norm = _final_norm(model)
    hook = norm.register_forward_hook(lambda mod, args, out: captured.__setitem__("last", args[0]))
    try:
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            output_hidden_states=True,
            use_cache=False,
            logits_to_keep=0 if want_logits else 1,
        )
    finally:
        hook.remove()
    hs = out.hidden_states
    aux = torch.cat([hs[i] for i in layers], dim=-1)  # [B,T,3H]
    return aux, captured["last"], (out.logits if want_logits else None)


def aux_hidden(target, input_ids, attention_mask=None, layers=None) -> torch.Tensor:
    """[B,T,3H]: concatenation (low, mid, high) of the captured "input of layer i" states."""
    return target_states(target, input_ids, attention_mask, layers)[0]


def final_feature(target, last: torch.Tensor) -> torch.Tensor:
    """[..,H] pre-norm last state -> the final hidden state SGLang's EAGLE sends (after the final norm)."""
    model = target.model if hasattr(target, "model") else target
    return _final_norm(model)(last)


def final_hidden(target, input_ids, attention_mask=None) -> torch.Tensor:
    """[B,T,H]: the target's final (post-norm) hidden state (EAGLE-1-style draft input)."""
    model = target.model if hasattr(target, "model") else target
    n = text_config(model.config).num_hidden_layers
    return final_feature(target, target_states(target, input_ids, attention_mask, layers=[0, 0, n - 1])[1])


def draft_features(target, draft, input_ids, attention_mask=None) -> torch.Tensor:
    """What `draft.project` expects: aux states (EAGLE-3) or the final state (EAGLE-1)."""
    aux, last, _ = target_states(target, input_ids, attention_mask, layers=draft_layers(target, draft))
    return aux if draft.use_aux else final_feature(target, last)


def draft_layers(target, draft) -> list[int]:
    layers = draft.capture_layers
    if layers is None:
        layers = target.capture_layers
    return list(layers)


@torch.no_grad()
def logits_from_last(target, last: torch.Tensor, vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Target logits from the stored pre-norm last state: lm_head(norm(last)), optionally only
    the columns `vocab_ids` (e.g. the draft vocabulary) [..., len(vocab_ids)]."""
    model = target.model if hasattr(target, "model") else target
    x = _final_norm(model)(last)
    w = model.get_output_embeddings().weight
    if vocab_ids is not None:
        w = w[vocab_ids]
    return x @ w.T.to(x.dtype)


# ---- offline hidden states: precomputed safetensors shards ------------------------------------
# A shard is written to `shard-NNNNN.safetensors.precompute.tmp`, then renamed. A SIGKILL mid-write leaves
# that file (tens of MB); the name says whose it is, so the next call removes it without guessing.
TMP_SUFFIX = ".precompute.tmp"


def remove_leftover_temps(out_dir) -> list:
    """Remove the temp files an interrupted `precompute_hidden` left in `out_dir`; returns their paths.

    Only names this module writes: shard temps (TMP_SUFFIX, and `shard-NNNNN.safetensors.tmp` of
    draftlab before it), and the index's temp (core.files' default `.tmp` beside index.json);
    anything else in the folder is left alone.
    """
    from pathlib import Path

    out = Path(out_dir)
    leftovers = [
        p
        for pattern in (f"shard-*.safetensors{TMP_SUFFIX}", "shard-*.safetensors.tmp", "index.json.tmp")
        for p in sorted(out.glob(pattern))
    ]
    for path in leftovers:
        print(
            f"{path}: removing a temp file ({path.stat().st_size / 1e6:.1f} MB) left by an interrupted precompute",
            flush=True,
        )
        path.unlink()
    return leftovers


def _ids_fingerprint(dataset) -> str:
    import hashlib

    h = hashlib.sha256()
    for sid, ids in zip(dataset["id"], dataset["input_ids"]):
        h.update(f"{sid}:{len(ids)};".encode())
    return h.hexdigest()[:16]


def estimate_bytes(num_tokens: int, hidden_size: int, store_aux: bool, dtype: torch.dtype) -> int:
    """Bytes the shards will take: per token (3H if aux) + H values."""
    width = (3 * hidden_size if store_aux else 0) + hidden_size
    return num_tokens * width * torch.tensor([], dtype=dtype).element_size()


# What a store's index.json must agree on for a restart to keep its finished shards.
STORE_KEYS = ("layers", "hidden_size", "store_aux", "dtype", "fingerprint", "target", "last")
# `last` in a store: "pre_norm" (transformers here: the final norm's input, logits = head(norm(last))) or
# "post_norm" (SGLang's capture: the final norm's output, what its EAGLE worker receives).
LAST_PRE_NORM, LAST_POST_NORM = "pre_norm", "post_norm"


def open_store(out_dir, meta: dict) -> dict:
    """`meta` (STORE_KEYS + num_samples), with the finished shards of an earlier run of the same job in
    meta["shards"]; removes a killed run's temp files first. Another job's index is started over."""
    import json
    from pathlib import Path

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    remove_leftover_temps(out)
    meta = {**meta, "shards": []}
    index_path = out / "index.json"
    if index_path.is_file():
        old = json.loads(index_path.read_text())
        old.setdefault("last", LAST_PRE_NORM)  # stores written before `last` was recorded
        if all(old.get(k) == meta[k] for k in STORE_KEYS):
            meta["shards"] = old["shards"]
        else:
            print(f"{index_path}: made for other data or settings; recomputing from scratch")
    return meta


def samples_done(meta: dict) -> int:
    """Samples (in dataset order) the finished shards hold: where a restart continues."""
    return meta["shards"][-1]["end"] if meta["shards"] else 0


def check_free_disk(out_dir, need: float, what: str, instead: str) -> None:
    """Refuse before the first shard, not at the disk's end (21.6K conversations: 35 GB in bf16)."""
    free = shutil.disk_usage(out_dir).free
    if need > free:
        raise RunFailure(f"{out_dir}: {what} need {need / 1e9:.1f} GB more, {free / 1e9:.1f} GB free ({instead})")


def write_shard(out_dir, meta: dict, tensors: dict, start: int, end: int, **extra) -> None:
    """Samples start..end-1 as one shard (temp name, then renamed), then index.json naming it.

    A tensor may be given as its parts, one [n_i, W] block per sample: joined along dim 0 here."""
    from pathlib import Path

    import torch
    from safetensors.torch import save_file

    out = Path(out_dir)
    name = f"shard-{len(meta['shards']):05d}.safetensors"
    with atomic_path(out / name, suffix=TMP_SUFFIX) as tmp:
        whole = {k: torch.cat(v) if isinstance(v, (list, tuple)) else v for k, v in tensors.items()}
        save_file({k: v.contiguous() for k, v in whole.items()}, str(tmp))
    meta["shards"].append({"file": name, "start": start, "end": end, **extra})
    atomic_write_json(out / "index.json", meta)


def precompute_hidden(
    target,
    dataset,
    out_dir,
    layers=None,
    store_aux: bool = True,
    batch_tokens: int = 8192,
    shard_tokens: int = 1 << 20,
    dtype: torch.dtype = torch.bfloat16,
) -> "OfflineHidden":
    """Write the target's states for every sample to `out_dir/shard-NNNNN.safetensors`.

    Each shard holds `last` [n_tok, H] (pre-norm final state) and, with store_aux, `aux`
    [n_tok, 3H] for a contiguous run of samples. index.json lists finished shards; a restart
    continues after the last finished shard (a shard is written to a temp name, then renamed) and
    first removes the temp files a killed run left (remove_leftover_temps).
    """
    out = out_dir
    layers = list(layers if layers is not None else target.capture_layers)
    lengths = [len(x) for x in dataset["input_ids"]]
    meta = open_store(
        out,
        {
            "layers": layers,
            "hidden_size": target.hidden_size,
            "store_aux": store_aux,
            "dtype": str(dtype),
            "fingerprint": _ids_fingerprint(dataset),
            "num_samples": len(lengths),
            "target": str(target.name),
            "last": LAST_PRE_NORM,
        },
    )
    done = samples_done(meta)
    total = sum(lengths)
    est = estimate_bytes(total, target.hidden_size, store_aux, dtype)
    print(
        f"offline hidden states: {len(lengths)} samples, {total:,} tokens -> {est / 1e9:.2f} GB "
        f"({'aux 3H + ' if store_aux else ''}last H, {dtype}) in {out}; "
        f"{done} samples already done",
        flush=True,
    )
    need = est * sum(lengths[done:]) / max(total, 1)
    check_free_disk(out, need, "the offline hidden states", "train with hidden online, or another hidden_dir")
    pad = target.tokenizer.pad_token_id or 0
    bar = tqdm(total=sum(lengths[done:]), unit="tok", desc="hidden states", leave=False)
    start, i = done, done
    buf_aux, buf_last, buf_tok = [], [], 0
    while i < len(lengths):
        j = i
        while j < len(lengths) and (j == i or max(lengths[i : j + 1]) * (j + 1 - i) <= batch_tokens):
            j += 1
        rows = dataset[i:j]["input_ids"]
        longest = max(len(r) for r in rows)
        ids = torch.full((len(rows), longest), pad, dtype=torch.int64)
        mask = torch.zeros_like(ids)
        for r, row in enumerate(rows):
            ids[r, : len(row)] = torch.tensor(row)
            mask[r, : len(row)] = 1
        aux, last, _ = target_states(target, ids, mask, layers)
        for r, row in enumerate(rows):
            if store_aux:
                buf_aux.append(aux[r, : len(row)].to("cpu", dtype))
            buf_last.append(last[r, : len(row)].to("cpu", dtype))
            buf_tok += len(row)
        bar.update(sum(len(r) for r in rows))
        i = j
        if buf_tok >= shard_tokens or i == len(lengths):
            tensors = {"last": torch.cat(buf_last)}
            if store_aux:
                tensors["aux"] = torch.cat(buf_aux)
            write_shard(out, meta, tensors, start, i)
            start, buf_aux, buf_last, buf_tok = i, [], [], 0
    bar.close()
    return OfflineHidden(out, dataset)


class OfflineHidden:
    """Reads precomputed states back by sample index (padded batches)."""

    def __init__(self, out_dir, dataset):
        import json
        from pathlib import Path

        self.dir = Path(out_dir)
        meta = json.loads((self.dir / "index.json").read_text())
        if meta["fingerprint"] != _ids_fingerprint(dataset) or meta["shards"][-1]["end"] != len(dataset):
            raise ValueError(
                f"{self.dir}: offline hidden states are incomplete or belong to other data; rerun precompute_hidden"
            )
        self.meta = meta
        self.layers = meta["layers"]
        self.last = meta.get("last", LAST_PRE_NORM)  # post_norm: train against a target whose norm is applied
        self.store_aux = meta["store_aux"]
        self.where = []  # sample -> (shard file, token offset, length)
        lengths = [len(x) for x in dataset["input_ids"]]
        for sh in meta["shards"]:
            off = 0
            for k in range(sh["start"], sh["end"]):
                self.where.append((sh["file"], off, lengths[k]))
                off += lengths[k]
        self._open = {}

    def _handle(self, name):
        from safetensors import safe_open

        if name not in self._open:
            self._open[name] = safe_open(str(self.dir / name), framework="pt")
        return self._open[name]

    def get(self, indices, length: int, want_aux: bool = True):
        """-> (aux [B,L,3H] or None, last [B,L,H]) zero-padded on the right to `length`.

        Each sample's rows are copied from its shard straight into the batch, in pinned memory where
        CUDA is (so that the copy to the GPU can run asynchronously): a 16,384-token batch is 75 MB in
        bf16, and a copy per padding and per stack cost as much host time as the target's forward."""
        if want_aux and not self.store_aux:
            raise ValueError(f"{self.dir}: stored without aux states (EAGLE-1 only); recompute with store_aux")
        h, dtype = self.meta["hidden_size"], getattr(torch, self.meta["dtype"].removeprefix("torch."))
        pinned = torch.cuda.is_available()
        last = torch.zeros(len(indices), length, h, dtype=dtype, pin_memory=pinned)
        aux = torch.zeros(len(indices), length, 3 * h, dtype=dtype, pin_memory=pinned) if want_aux else None
        for b, k in enumerate(indices):
            name, off, n = self.where[k]
            f = self._handle(name)
            last[b, :n] = f.get_slice("last")[off : off + n]
            if want_aux:
                aux[b, :n] = f.get_slice("aux")[off : off + n]
        return aux, last
