"""The training run: set-up (target, data, vocabulary, draft), the step loop, validation and resume."""

from __future__ import annotations

import json
import random
import time
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from draftlab.model.chat_data import load_tokenized
from draftlab.model.draft import Eagle3Draft, draft_config_for_target
from draftlab.model.hidden import OfflineHidden, precompute_hidden
from draftlab.model.target import autocast, avoid_cudnn_attention, load_target, resolve_device
from draftlab.train_draft.checkpoint import (
    Logs,
    _optimizer_state,
    _tuple,
    find_checkpoint,
    save_checkpoint,
    summarize,
)
from draftlab.train_draft.config import TrainConfig
from draftlab.train_draft.objective import (
    ATTENTION_KERNELS,
    Features,
    TTTObjective,
    _all_reduce,
    attention_kernel,
    collate,
    dist_info,
    epoch_plans,
    plan_epoch,
    soft_targets,
)
from draftlab.train_draft.vocab import build_draft_vocab, coverage, save_vocab, token_counts


# ---- the training run ------------------------------------------------------------------------
def train(cfg: TrainConfig, resume: bool = False, target=None) -> dict:
    """Train a draft; returns {"draft", "target", "out_dir", "final", "eval", "stats", ...}.

    Under torchrun every rank calls this; rank 0 writes logs and checkpoints.
    """
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
        with autocast(device):
            target_d, top, in_vocab = soft_targets(target, last.to(target.model.dtype), dids, t2d)
        pred_mask = F.pad((loss_mask & valid)[:, 1:], (0, 1))  # [B,L]: token p+1 is an assistant token
        return f, ids, valid, pred_mask, in_vocab, target_d, top

    def evaluate() -> dict:
        draft.eval()
        stats = torch.zeros(cfg.ttt_steps, 4, device=device)
        vplan = plan_epoch([len(x) for x in val_ds["input_ids"]], cfg.batch_tokens, cfg.max_batch, cfg.seed, -1)
        with torch.no_grad(), autocast(device), attention_kernel(cfg.attention):
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
                with autocast(device):
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
