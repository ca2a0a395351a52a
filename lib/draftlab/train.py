"""EAGLE-3 (and EAGLE-1-style) draft training with training-time test (TTT).

One code path for both architectures, online hidden states (target forward inside the step) or
offline shards (hidden.precompute_hidden), one process or several through torchrun (DDP).

Per step i = 0..ttt_steps-1 the draft's slot t predicts token t+2+i; its soft target is the
target's distribution at position t+1+i restricted to the draft vocabulary; the loss covers slots
whose predicted token is an assistant token and whose target arg-max lies in the draft vocabulary
(contract section 3), weighted 0.8^i. Accuracy (logged and used for the simulated acceptance
length) counts every assistant position, an out-of-vocabulary target counting as a miss.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import random
import shutil
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from draftlab.draft import Eagle3Draft, config_from_dict, draft_config_for_target


@dataclass
class TrainConfig:
    train_file: str = ""  # canonical conversations (JSONL), e.g. RUN_DIR/data/regen/train.jsonl
    val_file: str = ""  # validation conversations (JSONL); empty: no eval
    out_dir: str = "results/dev/train/eagle3"  # logs, checkpoints, vocab.json
    target: str = "tiny"  # target spec for draftlab.target.load_target
    arch: str = "eagle3"  # eagle3 (three aux states + fc) or eagle1 (final state only, no fc)
    device: str = "auto"
    capture_layers: list = field(default_factory=list)  # empty: SGLang default [2, N//2, N-3]
    draft_vocab_size: int = 32000
    intermediate_size: int = 0  # 0: the target's
    init_from_target: bool = False  # lm_head rows and final norm copied from the target (measured worse on quick)
    max_len: int = 2048  # tokens per conversation
    overlong: str = "truncate"  # or "drop"
    max_train_samples: int = 0  # 0: all
    max_val_samples: int = 256
    epochs: float = 2.0
    batch_tokens: int = 16384  # padded tokens per micro-batch (per process)
    max_batch: int = 64  # sequences per micro-batch at most
    grad_accum: int = 1
    ttt_steps: int = 7
    step_decay: float = 0.8
    lr: float = 1e-4
    warmup_ratio: float = 0.015
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    hidden: str = "online"  # online | offline
    hidden_dir: str = ""  # offline shards (default: <out_dir>/../hidden/<split>)
    hidden_dtype: str = "auto"  # offline storage: auto = bfloat16 on GPU, float32 on CPU
    log_every: int = 10
    eval_every: int = 200
    save_every: int = 500
    keep_checkpoints: int = 2
    stop_after: int = 0  # stop after this many steps in this call (simulated crash / time box); 0: run to the end
    seed: int = 0
    threads: int = 2  # torch threads on CPU
    pad_multiple: int = 1  # batch length rounded up to this (64 helped only cuDNN's attention: LOG.md)
    attention: str = "auto"  # SDPA kernel: auto (torch's choice, cuDNN's off on CUDA) | cudnn | efficient | flash | math

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown training settings {sorted(unknown)}; known: {sorted(names)}")
        return cls(**d)


# ---- distributed helpers ---------------------------------------------------------------------
def dist_info():
    """(world, rank, local_rank) from torchrun's environment."""
    return int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))


def _all_reduce(t: torch.Tensor) -> torch.Tensor:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(t)
    return t


# ---- batches ---------------------------------------------------------------------------------
def plan_epoch(lengths: list[int], batch_tokens: int, max_batch: int, seed: int, epoch: int) -> list[list[int]]:
    """Deterministic batches for one epoch: shuffle, sort chunks by length (less padding), group
    under the token budget, shuffle batch order. Same (seed, epoch) -> same plan on every rank."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(len(lengths), generator=g).tolist()
    batches = []
    chunk = max(256, 16 * max_batch)
    for c in range(0, len(perm), chunk):
        cur, longest = [], 0
        for i in sorted(perm[c:c + chunk], key=lambda k: lengths[k]):
            if cur and (max(longest, lengths[i]) * (len(cur) + 1) > batch_tokens or len(cur) >= max_batch):
                batches.append(cur)
                cur, longest = [], 0
            cur.append(i)
            longest = max(longest, lengths[i])
        if cur:
            batches.append(cur)
    order = torch.randperm(len(batches), generator=g).tolist()
    return [batches[k] for k in order]


def epoch_plans(lengths, cfg: TrainConfig, per_step: int):
    """[(epoch, plan, steps in it)] covering cfg.epochs (a fractional last epoch is cut)."""
    plans, n_full = [], math.ceil(cfg.epochs)
    for e in range(n_full):
        plan = plan_epoch(lengths, cfg.batch_tokens, cfg.max_batch, cfg.seed, e)
        steps = len(plan) // per_step
        if e == n_full - 1 and cfg.epochs < n_full:
            steps = int(steps * (cfg.epochs - e))
        plans.append((e, plan, steps))
    return plans


def collate(dataset, indices, pad_id: int, multiple: int = 1):
    """-> input_ids [B,L], valid [B,L] bool, loss_mask [B,L] bool (right padding).

    L is the longest row rounded up to `multiple`: fewer distinct shapes, for kernels that plan per
    shape (cuDNN's attention: 1.8x faster with 64 on an H200; the default kernels need no rounding)."""
    rows = dataset[indices] if not isinstance(indices, int) else dataset[[indices]]
    longest = max(len(r) for r in rows["input_ids"])
    longest = -(-longest // multiple) * multiple
    b = len(indices)
    ids = torch.full((b, longest), pad_id, dtype=torch.int64)
    valid = torch.zeros(b, longest, dtype=torch.bool)
    loss = torch.zeros(b, longest, dtype=torch.bool)
    for r, (x, m) in enumerate(zip(rows["input_ids"], rows["loss_mask"])):
        ids[r, : len(x)] = torch.tensor(x)
        valid[r, : len(x)] = True
        loss[r, : len(x)] = torch.tensor(m, dtype=torch.bool)
    return ids, valid, loss


ATTENTION_KERNELS = ("auto", "cudnn", "efficient", "flash", "math")


def attention_kernel(name: str):
    """Pin scaled_dot_product_attention in a training step to one kernel ("auto": torch chooses)."""
    if name == "auto":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}[name]
    return sdpa_kernel([backend])


# ---- the TTT objective -----------------------------------------------------------------------
def _shift(x: torch.Tensor, k: int, length: int) -> torch.Tensor:
    """x[:, k:k+length] zero-padded on the right to `length` (dim 1)."""
    y = x[:, k:k + length]
    if y.shape[1] < length:
        pad = [0, 0] * (x.dim() - 2) + [0, length - y.shape[1]]
        y = F.pad(y, pad)
    return y


class TTTObjective(nn.Module):
    """Wraps the draft so that DDP sees one forward per micro-batch: returns (loss, stats).

    stats [steps, 4] = (sum of soft CE over trained slots, trained slots, correct, scored slots).
    """

    def __init__(self, draft: Eagle3Draft, steps: int, decay: float):
        super().__init__()
        self.draft = draft
        self.steps = steps
        self.decay = decay

    def _step_loss(self, hid, target_d, trained, scored, target_top):
        """One TTT step: (masked mean soft CE, stats row [4]) from the step's pre-norm output.

        The head and both softmaxes run on the scored slots only (assistant tokens; prompt and
        padding slots are a third or more of a batch and would only be masked out afterwards)."""
        keep = scored.nonzero(as_tuple=True)
        trained, top = trained[keep].float(), target_top[keep]  # [N]
        logits = self.draft.head(hid[keep])  # [N,Vd]
        logp = torch.log_softmax(logits.float(), -1)
        p = torch.softmax(target_d[keep].float(), -1)
        ce = -(p * logp).sum(-1)  # [N]
        n = trained.sum()
        loss = (ce * trained).sum() / n.clamp(min=1)
        with torch.no_grad():
            correct = (self.draft.to_target_ids(logits.argmax(-1)) == top).sum()
            st = torch.stack([(ce.detach() * trained).sum(), n, correct.float(),
                              torch.tensor(float(top.numel()), device=n.device)])
        return loss, st

    def forward(self, feats, input_ids, valid, pred_mask, in_vocab, target_d, target_top):
        # feats [B,L,F]; everything else [B,L(,Vd)] indexed by position p; slot t uses p = t+1+i.
        length = input_ids.shape[1] - 1
        hidden = self.draft.project(feats[:, :length])  # [B,T,H]
        pos = torch.arange(length, device=input_ids.device)[None].expand(input_ids.shape[0], -1)
        total = hidden.new_zeros((), dtype=torch.float32)
        stats = []
        for i, hid in self.draft.ttt_forward(input_ids[:, 1:], hidden, pos, valid[:, 1:], self.steps):
            scored = _shift(pred_mask, 1 + i, length)  # [B,T] assistant token to predict
            trained = scored & _shift(in_vocab, 1 + i, length)
            args = (hid, _shift(target_d, 1 + i, length), trained, scored, _shift(target_top, 1 + i, length))
            if torch.is_grad_enabled() and hid.is_cuda:
                # GPU memory: the [B,T,Vd] logits/softmaxes are recomputed in backward, not kept per step.
                loss_i, st = torch.utils.checkpoint.checkpoint(self._step_loss, *args, use_reentrant=False)
            else:
                loss_i, st = self._step_loss(*args)
            total = total + (self.decay ** i) * loss_i
            stats.append(st)
        return total, torch.stack(stats)


# ---- features and targets --------------------------------------------------------------------
class Features:
    """Target states for a batch: online (a target forward) or offline (precomputed shards)."""

    def __init__(self, target, layers, use_aux: bool, offline=None):
        self.target, self.layers, self.use_aux, self.offline = target, layers, use_aux, offline

    @torch.no_grad()
    def __call__(self, indices, ids, valid, device):
        from draftlab.hidden import final_feature, target_states

        if self.offline is not None:
            aux, last = self.offline.get(indices, ids.shape[1], want_aux=self.use_aux)
            aux = aux.to(device) if aux is not None else None
            last = last.to(device)
        else:
            aux, last, _ = target_states(self.target, ids, valid.long(), self.layers)
        return (aux if self.use_aux else final_feature(self.target, last)), last


@torch.no_grad()
def soft_targets(target, last, draft_ids, t2d, chunk: int = 8192):
    """From the pre-norm final state: (target logits over the draft vocab [B,L,Vd], full arg-max [B,L],
    arg-max in draft vocab [B,L]); computed in chunks of positions to bound memory."""
    from draftlab.hidden import logits_from_last

    b, l, h = last.shape
    flat = last.reshape(b * l, h)
    d_parts, top_parts = [], []
    for s in range(0, flat.shape[0], chunk):
        full = logits_from_last(target, flat[s:s + chunk])  # [n,V]
        top_parts.append(full.argmax(-1))
        d_parts.append(full[:, draft_ids])
    target_d = torch.cat(d_parts).reshape(b, l, -1)
    top = torch.cat(top_parts).reshape(b, l)
    return target_d, top, t2d[top]


# ---- checkpoints -----------------------------------------------------------------------------
def _optimizer_tensors(opt) -> tuple[dict, dict]:
    """Optimizer state -> (tensors for safetensors, JSON-able rest)."""
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for pid, st in sd["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"state.{pid}.{k}"] = v.detach().cpu().contiguous()
            else:
                scalars[f"{pid}.{k}"] = v
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _optimizer_state(tensors: dict, rest: dict) -> dict:
    state = {}
    for name, v in tensors.items():
        if not name.startswith("state."):
            continue
        _, pid, k = name.split(".", 2)
        state.setdefault(int(pid), {})[k] = v
    for name, v in rest["scalars"].items():
        pid, k = name.split(".", 1)
        state.setdefault(int(pid), {})[k] = v
    return {"state": state, "param_groups": rest["param_groups"]}


def save_checkpoint(out_dir: Path, step: int, draft, opt, sched, cfg: TrainConfig, extra: dict) -> Path:
    """ckpt-NNNNNNN/: draft.safetensors, optimizer.safetensors (+ RNG), state.json; atomic rename."""
    from safetensors.torch import save_file

    final = out_dir / f"ckpt-{step:07d}"
    tmp = out_dir / f".ckpt-{step:07d}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in draft.state_dict().items()}, str(tmp / "draft.safetensors"))
    opt_t, opt_rest = _optimizer_tensors(opt)
    opt_t["rng.torch"] = torch.get_rng_state()
    if torch.cuda.is_available():
        opt_t["rng.cuda"] = torch.cuda.get_rng_state()
    save_file(opt_t, str(tmp / "optimizer.safetensors"))
    state = {"step": step, "train_config": asdict(cfg), "draft_config": draft.config.to_dict(),
             "optimizer": opt_rest, "scheduler": sched.state_dict(),
             "python_random": _jsonable(random.getstate()), **extra}
    (tmp / "state.json").write_text(json.dumps(state, indent=1))
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    (out_dir / "latest").write_text(final.name + "\n")
    ckpts = sorted(out_dir.glob("ckpt-*"))
    for old in ckpts[: max(0, len(ckpts) - cfg.keep_checkpoints)]:
        shutil.rmtree(old)
    return final


def _jsonable(x):
    return [_jsonable(v) for v in x] if isinstance(x, (list, tuple)) else x


def _tuple(x):
    return tuple(_tuple(v) for v in x) if isinstance(x, list) else x


def find_checkpoint(path) -> Path:
    """A ckpt-* folder, or the latest one of a training folder."""
    path = Path(path)
    if (path / "state.json").is_file():
        return path
    if (path / "latest").is_file():
        ck = path / (path / "latest").read_text().strip()
        if (ck / "state.json").is_file():
            return ck
    ckpts = sorted(path.glob("ckpt-*"))
    if not ckpts:
        raise FileNotFoundError(f"{path}: no checkpoint (ckpt-*/state.json); train first (draftlab train)")
    return ckpts[-1]


def load_checkpoint_draft(path, target_spec: str | None = None, device: str = "cpu", target=None):
    """(draft with trained weights, Target) from a checkpoint, for export or evaluation; `target`:
    an already loaded one (its embedding is shared, as in training)."""
    from safetensors.torch import load_file

    from draftlab.target import load_target

    ck = find_checkpoint(path)
    state = json.loads((ck / "state.json").read_text())
    if target is None:
        target = load_target(target_spec or state["train_config"]["target"], device=device)
    dc = dict(state["draft_config"])
    ids = (dc.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if "draftlab" not in dc and ids is not None:
        # a checkpoint holds the in-memory config, whose ids are already hidden_states indices: say so,
        # or config_from_dict reads them as SGLang's exported ids and shifts every layer by one
        dc["draftlab"] = {"capture_layers": ids}
    draft = Eagle3Draft(config_from_dict(dc), target.model.get_input_embeddings())
    draft.load_state_dict(load_file(str(ck / "draft.safetensors")))
    return draft.to(target.device).eval(), target


# ---- logs ------------------------------------------------------------------------------------
class Logs:
    """train.csv + eval.csv + TensorBoard under out_dir (rank 0 only); rows past a resumed step dropped."""

    def __init__(self, out_dir: Path, start_step: int):
        from torch.utils.tensorboard import SummaryWriter

        self.dir = out_dir
        for name in ("train.csv", "eval.csv"):
            p = out_dir / name
            if p.is_file():
                with open(p) as f:
                    rows = [r for r in csv.DictReader(f) if int(r["step"]) <= start_step]
                self._write(p, rows, rewrite=True)
        self.tb = SummaryWriter(log_dir=str(out_dir / "tb"), purge_step=start_step + 1 if start_step else None)

    @staticmethod
    def _write(path: Path, rows: list[dict], rewrite: bool = False):
        if not rows and not rewrite:
            return
        exists = path.is_file() and not rewrite
        fields = list(rows[0].keys()) if rows else []
        if exists:
            with open(path) as f:
                fields = next(csv.reader(f), fields)
        with open(path, "a" if exists else "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            if not exists and fields:
                w.writeheader()
            w.writerows(rows)

    def log(self, kind: str, row: dict):
        self._write(self.dir / f"{kind}.csv", [row])
        for k, v in row.items():
            if k != "step" and isinstance(v, (int, float)):
                self.tb.add_scalar(f"{kind}/{k}", v, row["step"])
        self.tb.flush()


def summarize(stats: torch.Tensor, decay: float) -> dict:
    """stats [steps, 4] summed -> loss_i, acc_i, weighted loss, simulated acceptance length."""
    out, loss, accept, chain = {}, 0.0, 1.0, 1.0
    for i, (ce, n, correct, scored) in enumerate(stats.tolist()):
        li = ce / max(n, 1)
        ai = correct / max(scored, 1)
        out[f"loss_{i}"], out[f"acc_{i}"] = li, ai
        loss += decay ** i * li
        chain *= ai
        accept += chain
    out["loss"] = loss
    out["sim_accept_len"] = accept
    return out


# ---- the training run ------------------------------------------------------------------------
def train(cfg: TrainConfig, resume: bool = False, target=None) -> dict:
    """Train a draft; returns {"draft", "target", "out_dir", "final", "eval", "stats", ...}.

    Under torchrun every rank calls this; rank 0 writes logs and checkpoints.
    """
    from draftlab.chat_data import load_tokenized
    from draftlab.hidden import OfflineHidden, precompute_hidden
    from draftlab.target import avoid_cudnn_attention, load_target, resolve_device
    from draftlab.vocab import build_draft_vocab, coverage, save_vocab, token_counts

    phases, mark = {}, [time.time()]  # set-up seconds by phase (printed with their sum): where a slow start goes

    def phase_done(name: str) -> None:
        phases[name], mark[0] = time.time() - mark[0], time.time()

    if cfg.arch not in ("eagle3", "eagle1"):
        raise ValueError(f"arch = {cfg.arch!r}, expected eagle3 or eagle1")
    if cfg.hidden not in ("online", "offline"):
        raise ValueError(f"hidden = {cfg.hidden!r}, expected online or offline")
    if cfg.attention not in ATTENTION_KERNELS:
        raise ValueError(f"attention = {cfg.attention!r}, expected one of {list(ATTENTION_KERNELS)}")
    world, rank, local_rank = dist_info()
    device = resolve_device(cfg.device)
    if world > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
        if device.startswith("cuda"):
            device = f"cuda:{local_rank}"
            torch.cuda.set_device(device)
    if not device.startswith("cuda"):
        torch.set_num_threads(max(1, cfg.threads))
    is_main = rank == 0
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)

    if target is None:
        target = load_target(cfg.target, device=device)
    target.model.requires_grad_(False)
    phase_done("target")
    use_amp = device.startswith("cuda")

    def amp():
        """A fresh bf16 autocast context on CUDA (one object must not be entered twice, nested)."""
        return torch.autocast("cuda", dtype=torch.bfloat16) if use_amp else nullcontext()

    if device.startswith("cuda"):
        avoid_cudnn_attention()  # also when the caller built the target itself

    # data (rank 0 tokenises and caches first, the others read the cache)
    cache = out_dir.parent / "tokens"
    if world > 1 and not is_main:
        torch.distributed.barrier()
    lim = cfg.max_train_samples or None
    train_ds, train_stats = load_tokenized(cfg.train_file, target.tokenizer, cfg.max_len, cfg.overlong, cache, lim)
    val_ds, val_stats = (load_tokenized(cfg.val_file, target.tokenizer, cfg.max_len, cfg.overlong, cache,
                                        cfg.max_val_samples or None) if cfg.val_file else (None, None))
    if world > 1 and is_main:
        torch.distributed.barrier()
    phase_done("data")

    # draft vocabulary and model
    counts = token_counts(train_ds, target.vocab_size)
    draft_ids = build_draft_vocab(counts, cfg.draft_vocab_size)
    layers = list(cfg.capture_layers) or target.capture_layers
    dcfg = draft_config_for_target(target.config, draft_vocab_size=cfg.draft_vocab_size, capture_layers=layers,
                                   intermediate_size=cfg.intermediate_size or None, use_aux=cfg.arch == "eagle3")
    draft = Eagle3Draft(dcfg, target.model.get_input_embeddings())
    draft.set_vocab(draft_ids)
    if cfg.init_from_target:
        with torch.no_grad():
            draft.lm_head.weight.copy_(target.model.get_output_embeddings().weight[draft_ids.to(target.device)].float().cpu())
            draft.norm.weight.copy_(target.model.base_model.norm.weight.float().cpu())
    draft.to(device)
    if is_main:
        save_vocab(out_dir / "vocab.json", draft_ids, counts)
    phase_done("vocab+draft")

    # hidden states
    offline = offline_val = None
    use_aux = cfg.arch == "eagle3"
    if cfg.hidden == "offline":
        hdtype = {"auto": torch.bfloat16 if device.startswith("cuda") else torch.float32}.get(
            cfg.hidden_dtype, getattr(torch, cfg.hidden_dtype, None))
        hdir = Path(cfg.hidden_dir) if cfg.hidden_dir else out_dir.parent / "hidden"
        shard = max(4 * cfg.batch_tokens, 8192)  # tokens per shard: the unit of resumption
        if is_main:
            precompute_hidden(target, train_ds, hdir / "train", layers, store_aux=True, dtype=hdtype,
                              batch_tokens=cfg.batch_tokens, shard_tokens=shard)
            if val_ds is not None:
                precompute_hidden(target, val_ds, hdir / "val", layers, store_aux=True, dtype=hdtype,
                                  batch_tokens=cfg.batch_tokens, shard_tokens=shard)
        if world > 1:
            torch.distributed.barrier()
        offline = OfflineHidden(hdir / "train", train_ds)
        offline_val = OfflineHidden(hdir / "val", val_ds) if val_ds is not None else None
        if offline.layers != layers:
            raise ValueError(f"{hdir}: stored layers {offline.layers} differ from capture layers {layers}")
    phase_done("hidden")
    feats = Features(target, layers, use_aux, offline)
    feats_val = Features(target, layers, use_aux, offline_val)

    objective = TTTObjective(draft, cfg.ttt_steps, cfg.step_decay)
    model = objective
    if world > 1:
        # Buffers (d2t, t2d, rope) are identical on every rank by construction: no per-step broadcast.
        model = nn.parallel.DistributedDataParallel(objective, device_ids=[local_rank] if device.startswith("cuda") else None,
                                                    broadcast_buffers=False)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)

    per_step = world * cfg.grad_accum
    lengths = [len(x) for x in train_ds["input_ids"]]
    plans = epoch_plans(lengths, cfg, per_step)
    total_steps = sum(s for _, _, s in plans)
    if total_steps == 0:
        raise ValueError(f"{cfg.train_file}: {len(lengths)} samples give no full step of {per_step} batches; "
                         "lower batch_tokens or add data")
    from transformers import get_cosine_schedule_with_warmup

    sched = get_cosine_schedule_with_warmup(opt, max(1, round(cfg.warmup_ratio * total_steps)), total_steps)

    step = 0
    prior_s = 0.0  # training seconds of the calls before a resume (each checkpoint records its total)
    if resume:
        try:
            ck = find_checkpoint(out_dir)
        except FileNotFoundError:
            ck = None
        if ck is not None:
            _check_same_recipe(ck, cfg)
            step = _restore(ck, draft, opt, sched, device)
            prior_s = float(json.loads((ck / "state.json").read_text()).get("train_elapsed_s", 0.0))
            if is_main:
                print(f"resumed from {ck} at step {step}/{total_steps}", flush=True)
    logs = Logs(out_dir, step) if is_main else None
    pad_id = target.tokenizer.pad_token_id or 0
    t2d = draft.t2d
    dids = draft.draft_ids()

    def batch_tensors(indices, feature_fn):
        ids, valid, loss_mask = collate(train_ds if feature_fn is feats else val_ds, indices, pad_id, cfg.pad_multiple)
        f, last = feature_fn(indices, ids, valid, device)
        ids, valid, loss_mask = ids.to(device), valid.to(device), loss_mask.to(device)
        with amp():
            target_d, top, in_vocab = soft_targets(target, last.to(target.model.dtype), dids, t2d)
        pred_mask = F.pad((loss_mask & valid)[:, 1:], (0, 1))  # [B,L]: token p+1 is an assistant token
        return f, ids, valid, pred_mask, in_vocab, target_d, top

    def evaluate() -> dict:
        draft.eval()
        stats = torch.zeros(cfg.ttt_steps, 4, device=device)
        vplan = plan_epoch([len(x) for x in val_ds["input_ids"]], cfg.batch_tokens, cfg.max_batch, cfg.seed, -1)
        with torch.no_grad(), amp(), attention_kernel(cfg.attention):
            for b in vplan[rank::world]:
                stats += objective(*batch_tensors(b, feats_val))[1].float()
        _all_reduce(stats)
        draft.train()
        return summarize(stats.cpu(), cfg.step_decay)

    # step -> (epoch, index of its first batch within the epoch)
    where = []
    for e, plan, steps in plans:
        where += [(e, plan, j) for j in range(steps)]
    phase_done("rest")
    if is_main:
        n_params = sum(p.numel() for p in params)
        print(f"train {cfg.arch}: {len(lengths)} conversations ({train_stats}), {sum(lengths):,} tokens, "
              f"{n_params / 1e6:.1f}M trainable, vocab coverage {coverage(counts, draft_ids):.3f}, "
              f"{total_steps} steps x {per_step} micro-batches, world {world}, device {device}; "
              f"set-up {sum(phases.values()):.1f} s ({', '.join(f'{k} {v:.1f}' for k, v in phases.items())})", flush=True)
    from tqdm.auto import tqdm

    draft.train()
    bar = tqdm(total=total_steps, initial=step, unit="step", desc=f"train {cfg.arch}", disable=not is_main)
    t0, tok_seen, window = time.time(), 0, torch.zeros(cfg.ttt_steps, 4)
    last_eval, started = None, step

    def where_now(epoch, j) -> dict:
        """What a checkpoint records besides the tensors: data position and training seconds so far."""
        return {"epoch": epoch, "batch_in_epoch": j + 1, "total_steps": total_steps,
                "train_elapsed_s": prior_s + time.time() - t0}

    if val_ds is not None and step == 0:  # the untrained draft: the baseline of the curves
        last_eval = {"step": 0, **evaluate()}
        if is_main:
            logs.log("eval", last_eval)
            print(f"step-0 evaluation: {time.time() - t0:.1f} s", flush=True)
        t0 = time.time()
    while step < total_steps:
        epoch, plan, j = where[step]
        chunk = plan[j * per_step:(j + 1) * per_step]
        mine = [chunk[a * world + rank] for a in range(cfg.grad_accum)]
        step_stats = torch.zeros(cfg.ttt_steps, 4, device=device)
        for a, b in enumerate(mine):
            sync = model.no_sync() if (world > 1 and a < cfg.grad_accum - 1) else nullcontext()
            with sync, attention_kernel(cfg.attention):  # forward and backward inside one no_sync (usable once)
                tensors = batch_tensors(b, feats)
                with amp():
                    loss, stats = model(*tensors)
                (loss / cfg.grad_accum).backward()
            step_stats += stats.float()
            tok_seen += int(tensors[2].sum())
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        window += _all_reduce(step_stats).cpu()
        bar.update(1)
        if is_main and (step % cfg.log_every == 0 or step == total_steps):
            dt = time.time() - t0
            row = {"step": step, "epoch": round(epoch + (j + 1) / max(1, len(plan) // per_step), 4),
                   "lr": sched.get_last_lr()[0], **summarize(window, cfg.step_decay),
                   "tokens_per_s": tok_seen * world / max(dt, 1e-9), "elapsed_s": dt}
            logs.log("train", row)
            bar.set_postfix(loss=f"{row['loss']:.3f}", acc0=f"{row['acc_0']:.3f}")
            window.zero_()
        if val_ds is not None and (step % cfg.eval_every == 0 or step == total_steps):
            last_eval = {"step": step, **evaluate()}
            if is_main:
                logs.log("eval", last_eval)
        if is_main and (step % cfg.save_every == 0 or step == total_steps):
            save_checkpoint(out_dir, step, draft, opt, sched, cfg, where_now(epoch, j))
        if world > 1 and step % cfg.save_every == 0:
            torch.distributed.barrier()
        if cfg.stop_after and step - started >= cfg.stop_after and step < total_steps:
            if is_main:
                save_checkpoint(out_dir, step, draft, opt, sched, cfg, where_now(epoch, j))
            break
    bar.close()
    if last_eval is None and val_ds is not None and step >= total_steps:  # resumed a finished run
        last_eval = {"step": step, **evaluate()}
    elapsed = time.time() - t0
    result = {"draft": draft, "target": target, "out_dir": out_dir, "steps": step, "total_steps": total_steps,
              "finished": step >= total_steps, "eval": last_eval, "train_stats": train_stats, "val_stats": val_stats,
              "elapsed_s": elapsed, "elapsed_total_s": prior_s + elapsed, "resumed_from_step": started or None,
              "hidden_precompute_s": phases["hidden"], "tokens_per_s": tok_seen * world / max(elapsed, 1e-9),
              "train_tokens": sum(lengths), "vocab_coverage": coverage(counts, draft_ids), "world": world}
    if is_main:
        (out_dir / "summary.json").write_text(json.dumps({k: v for k, v in result.items()
                                                          if k not in ("draft", "target", "out_dir")}, indent=1))
    return result


# Settings that may change between a run and its resumption (they do not change the result).
RESUME_FREE = ("stop_after", "eval_every", "save_every", "log_every", "keep_checkpoints", "threads", "device",
               "hidden", "hidden_dir", "max_val_samples", "val_file", "pad_multiple", "attention")


def _check_same_recipe(ck: Path, cfg: TrainConfig) -> None:
    old = json.loads((ck / "state.json").read_text())["train_config"]
    new = asdict(cfg)
    diff = {k: (old.get(k), new[k]) for k in new if k not in RESUME_FREE and old.get(k) != new[k]}
    if diff:
        raise ValueError(f"{ck}: was trained with other settings {diff} (old, new); use another out_dir or "
                         f"delete {ck.parent} to start afresh")


def _restore(ck: Path, draft, opt, sched, device) -> int:
    from safetensors.torch import load_file

    state = json.loads((ck / "state.json").read_text())
    draft.load_state_dict({k: v.to(device) for k, v in load_file(str(ck / "draft.safetensors")).items()})
    tensors = load_file(str(ck / "optimizer.safetensors"))
    opt.load_state_dict(_optimizer_state({k: v.to(device) if not k.endswith(".step") else v
                                          for k, v in tensors.items()}, state["optimizer"]))
    sched.load_state_dict(state["scheduler"])
    torch.set_rng_state(tensors["rng.torch"])
    if "rng.cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["rng.cuda"])
    random.setstate(_tuple(state["python_random"]))
    return int(state["step"])


# ---- CLI -------------------------------------------------------------------------------------
def add_train_parser(subparsers) -> argparse.ArgumentParser:
    """`draftlab train`: every TrainConfig field is a --flag; `torchrun ... -m draftlab.cli train` for DDP."""
    ap = subparsers.add_parser("train", help="train an EAGLE-3 (or EAGLE-1-style) draft with training-time test")
    choices = {"arch": ["eagle3", "eagle1"], "hidden": ["online", "offline"], "overlong": ["truncate", "drop"],
               "attention": list(ATTENTION_KERNELS)}
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if isinstance(default, bool):
            ap.add_argument(flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=default, metavar="BOOL")
        elif isinstance(default, list):
            ap.add_argument(flag, type=int, nargs=3, default=default, metavar="LAYER")
        else:
            ap.add_argument(flag, type=type(default), default=default, choices=choices.get(f.name))
    ap.add_argument("--resume", action="store_true", help="continue from OUT_DIR's latest checkpoint, exactly")
    ap.add_argument("--export", default="", help="after training, export the draft here (rank 0) and validate it")
    ap.set_defaults(func=_train_main)
    return ap


def _train_main(args) -> int:
    d = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)}
    d["capture_layers"] = list(d["capture_layers"] or [])
    result = train(TrainConfig(**d), resume=args.resume)
    _, rank, _ = dist_info()
    if args.export and rank == 0 and result["finished"]:
        from draftlab.export import export_draft, validate

        export_draft(result["draft"], args.export, max_position_embeddings=result["target"].max_position_embeddings)
        problems = validate(args.export, result["target"], allow_eagle1=not result["draft"].use_aux)
        print(f"exported {args.export}: " + ("conforms to the EAGLE-3 contract" if not problems else "; ".join(problems)))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


# ---- figures for notebook 04 -----------------------------------------------------------------
def read_logs(train_dir) -> tuple:
    """(train.csv, eval.csv) of a training folder as pandas DataFrames (eval may be empty)."""
    import pandas as pd

    d = Path(train_dir)
    tr = pd.read_csv(d / "train.csv")
    ev = pd.read_csv(d / "eval.csv") if (d / "eval.csv").is_file() else pd.DataFrame()
    return tr, ev


def plot_training(train_dirs: dict):
    """Loss (train) and validation acc_0 / simulated acceptance length per arch, one figure."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for arch, d in train_dirs.items():
        tr, ev = read_logs(d)
        axes[0].plot(tr["step"], tr["loss"], label=arch)
        if len(ev):
            axes[1].plot(ev["step"], ev["acc_0"], marker="o", label=arch)
            axes[2].plot(ev["step"], ev["sim_accept_len"], marker="o", label=arch)
    axes[0].set(title="training loss (TTT-weighted soft CE)", xlabel="step")
    axes[1].set(title="validation acc_0 (first draft token)", xlabel="step")
    axes[2].set(title="simulated acceptance length (val)", xlabel="step")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return fig


def plot_step_accuracy(evals: dict):
    """Final validation accuracy per TTT step i for each arch (bars)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.8 / max(1, len(evals))
    for k, (arch, ev) in enumerate(evals.items()):
        steps = sorted(int(c.split("_")[1]) for c in ev if c.startswith("acc_"))
        offset = (k - (len(evals) - 1) / 2) * width
        ax.bar([s + offset for s in steps], [ev[f"acc_{s}"] for s in steps], width, label=arch)
        ax.set_xticks(steps)
    ax.set(title="validation accuracy per draft step (teacher-forced tokens, own hidden states)",
           xlabel="draft step i", ylabel="acc_i")
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig
