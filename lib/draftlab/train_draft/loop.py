"""The training run: set-up (target, data, vocabulary, draft), the step loop, validation and resume.

`train` runs a TrainingRun, whose named phases are its methods, in order: check, device, target,
data, draft (vocabulary + model), hidden (offline states), optimizer (+ schedule and resume),
then the step loop with its evaluations and checkpoints. State lives on the object, so each
phase reads what the earlier ones set and nothing is shared through closures.
"""

from __future__ import annotations

import json
import random
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn
from transformers import get_scheduler

from draftlab.core.files import atomic_write_json
from draftlab.core.progress import tqdm
from draftlab.core.stop import graceful_stop
from draftlab.model.chat_data import load_tokenized
from draftlab.model.draft import Eagle3Draft, draft_config_for_target
from draftlab.model.hidden import OfflineHidden, precompute_hidden
from draftlab.model.target import autocast, avoid_cudnn_attention, load_target, resolve_device
from draftlab.sglang.head_target import load_head_target
from draftlab.sglang.hidden_cli import capture_for_training
from draftlab.train_draft.checkpoint import (
    Logs,
    check_same_recipe,
    find_checkpoint,
    remove_checkpoint_temps,
    restore_checkpoint,
    save_checkpoint,
    summarize,
)
from draftlab.train_draft.config import TrainConfig
from draftlab.train_draft.guards import (
    check_against_target,
    check_settings,
    check_trainable,
    learned_nothing,
    load_target_or_refuse,
)
from draftlab.train_draft.objective import (
    Features,
    TTTObjective,
    _all_reduce,
    attention_kernel,
    collate,
    compile_report,
    dist_info,
    epoch_plans,
    plan_epoch,
    targets_at,
)
from draftlab.train_draft.vocab import build_draft_vocab, coverage, save_vocab, token_counts

# TrainConfig.lr_schedule -> transformers' scheduler name (each after the warm-up of warmup_ratio)
LR_SCHEDULES = {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}


# ---- the training run ------------------------------------------------------------------------
def tokenized(cfg: TrainConfig, tokenizer):
    """cfg's train and val files tokenised, read from its cache (TrainConfig.token_cache_dir) or written
    there: ((train dataset, stats), (val dataset, stats), or (None, None) without a val file)."""
    cache = cfg.token_cache_dir()
    train = load_tokenized(cfg.train_file, tokenizer, cfg.max_len, cfg.overlong, cache, cfg.max_train_samples or None)
    val = (
        load_tokenized(cfg.val_file, tokenizer, cfg.max_len, cfg.overlong, cache, cfg.max_val_samples or None)
        if cfg.val_file
        else (None, None)
    )
    return train, val


def train(cfg: TrainConfig, resume: bool = False, target=None) -> dict:
    """Train a draft; returns {"draft", "target", "out_dir", "final", "eval", "stats", ...}.

    Under torchrun every rank calls this; rank 0 writes logs and checkpoints.
    """
    return TrainingRun(cfg, resume, target).run()


class TrainingRun:
    """One call of `train`. Set-up seconds are kept by phase (printed with their sum): where a slow start goes."""

    def __init__(self, cfg: TrainConfig, resume: bool = False, target=None):
        self.cfg, self.resume, self.target = cfg, resume, target
        self.phases: dict[str, float] = {}
        self._mark = time.time()

    def run(self) -> dict:
        """Set up, train, finish; a first SIGTERM/SIGINT ends the step, checkpoints and raises core.stop.Stopped."""
        hint = "rerun the same command" + ("" if self.resume else " with --resume") + " to continue"
        with graceful_stop(hint) as self.stop:
            self.setup()
            self.loop()
            result = self.finish()
            if self.halted:
                saved = f"checkpoint ckpt-{self.step:07d}" if self.step > self.started else "no new step to save"
                self.stop.stopped(f"training {self.out_dir} at step {self.step} of {self.total_steps} ({saved})")
        return result

    def setup(self) -> None:
        """Every phase before the step loop, in order (a profiler of the loop calls this too)."""
        self.prepare()
        self.build_optimizer()
        self.restore()
        self._phase_done("rest")
        self.report_setup()

    def prepare(self) -> None:
        """The phases up to the target's states (offline: stored once); a parent that precomputes them for
        several runs stops here (parallel.precompute_first)."""
        self.check()
        self.setup_device()
        self.load_target()
        self.load_data()
        self.build_draft()
        self.hidden_states()

    def _phase_done(self, name: str) -> None:
        self.phases[name], self._mark = time.time() - self._mark, time.time()

    # ---- set-up phases
    def check(self) -> None:
        """Everything that can be checked without the target, before the seconds it takes to load it:
        the settings, that the input files are files, and on resume that the checkpoint's recipe is this one."""
        cfg = self.cfg
        check_settings(cfg, LR_SCHEDULES)
        if self.resume:
            try:
                ck = find_checkpoint(cfg.out_dir)
            except FileNotFoundError:
                return
            check_same_recipe(ck, cfg)

    def setup_device(self) -> None:
        cfg = self.cfg
        self.world, self.rank, local_rank = dist_info()
        self.local_rank = local_rank
        device = resolve_device(cfg.device)
        if self.world > 1:
            import torch.distributed as dist

            if not dist.is_initialized():
                dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
            if device.startswith("cuda"):
                device = f"cuda:{local_rank}"
                torch.cuda.set_device(device)
        if not device.startswith("cuda"):
            torch.set_num_threads(max(1, cfg.threads))
        self.device, self.is_main = device, self.rank == 0
        self.out_dir = Path(cfg.out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)

    def load_target(self) -> None:
        if self.target is None:
            load = load_head_target if self.cfg.hidden == "sglang" else load_target  # sglang: no decoder here
            self.target = load_target_or_refuse(self.cfg.target, self.device, load)
        check_against_target(self.cfg, self.target)
        self.target.model.requires_grad_(False)
        self._phase_done("target")
        if self.device.startswith("cuda"):
            avoid_cudnn_attention()  # also when the caller built the target itself

    def load_data(self) -> None:
        """Rank 0 tokenises and caches first, the others read the cache."""
        if self.world > 1 and not self.is_main:
            torch.distributed.barrier()
        (self.train_ds, self.train_stats), (self.val_ds, self.val_stats) = tokenized(self.cfg, self.target.tokenizer)
        if self.world > 1 and self.is_main:
            torch.distributed.barrier()
        self.lengths = [len(x) for x in self.train_ds["input_ids"]]
        self._phase_done("data")

    def build_draft(self) -> None:
        """The draft vocabulary (most frequent loss-masked tokens) and the draft model."""
        cfg, target = self.cfg, self.target
        self.counts = token_counts(self.train_ds, target.vocab_size)
        self.share = check_trainable(self.train_stats, cfg.train_file, self.counts, target.tokenizer)
        self.draft_ids = build_draft_vocab(self.counts, cfg.draft_vocab_size)
        self.layers = list(cfg.capture_layers) or target.capture_layers
        dcfg = draft_config_for_target(
            target.config,
            draft_vocab_size=cfg.draft_vocab_size,
            capture_layers=self.layers,
            intermediate_size=cfg.intermediate_size or None,
            use_aux=cfg.arch == "eagle3",
            fc_norm=cfg.fc_norm,
        )
        draft = Eagle3Draft(dcfg, target.model.get_input_embeddings())
        draft.set_vocab(self.draft_ids)
        if cfg.init_from_target:
            with torch.no_grad():
                head = target.model.get_output_embeddings().weight[self.draft_ids.to(target.device)]
                draft.lm_head.weight.copy_(head.float().cpu())
                draft.norm.weight.copy_(target.model.base_model.norm.weight.float().cpu())
        draft.to(self.device)
        if self.is_main:
            save_vocab(self.out_dir / "vocab.json", self.draft_ids, self.counts)
        self.draft = draft
        self._phase_done("vocab+draft")

    def hidden_states(self) -> None:
        """Offline: the target's states for every conversation, precomputed once into shards."""
        cfg, target, layers = self.cfg, self.target, self.layers
        offline = offline_val = None
        use_aux = cfg.arch == "eagle3"
        if cfg.hidden in ("offline", "sglang"):
            hdtype = {"auto": torch.bfloat16 if self.device.startswith("cuda") else torch.float32}.get(
                cfg.hidden_dtype, getattr(torch, cfg.hidden_dtype, None)
            )
            hdir = Path(cfg.hidden_dir) if cfg.hidden_dir else self.out_dir.parent / "hidden"
            shard = max(4 * cfg.batch_tokens, 8192)  # tokens per shard: the unit of resumption
            if self.is_main and cfg.hidden == "sglang":
                capture_for_training(cfg.target, cfg.sglang_args, hdir, self.train_ds, self.val_ds, layers, hdtype)
            precompute = self.is_main and cfg.hidden == "offline"
            for split, ds in (("train", self.train_ds), ("val", self.val_ds)) if precompute else ():
                if ds is not None:
                    precompute_hidden(
                        target, ds, hdir / split, layers, store_aux=True, dtype=hdtype, batch_tokens=cfg.batch_tokens,
                        shard_tokens=shard,
                    )  # fmt: skip
            if self.world > 1:
                torch.distributed.barrier()
            offline = OfflineHidden(hdir / "train", self.train_ds)
            offline_val = OfflineHidden(hdir / "val", self.val_ds) if self.val_ds is not None else None
            if offline.layers != layers:
                raise ValueError(f"{hdir}: stored layers {offline.layers} differ from capture layers {layers}")
        self._phase_done("hidden")
        self.feats = Features(target, layers, use_aux, offline)
        self.feats_val = Features(target, layers, use_aux, offline_val)

    def build_optimizer(self) -> None:
        """The TTT objective (DDP-wrapped when distributed), AdamW and the learning-rate schedule over all epochs."""
        cfg = self.cfg
        self.objective = TTTObjective(
            self.draft, cfg.ttt_steps, cfg.step_decay, cfg.loss, cfg.recompute_head, cfg.compile
        )
        self.model = self.objective
        if self.world > 1:
            # Buffers (d2t, t2d, rope) are identical on every rank by construction: no per-step broadcast.
            self.model = nn.parallel.DistributedDataParallel(
                self.objective,
                device_ids=[self.local_rank] if self.device.startswith("cuda") else None,
                broadcast_buffers=False,
            )
        self.params = [p for p in self.draft.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
        self.per_step = self.world * cfg.grad_accum
        self.plans = epoch_plans(self.lengths, cfg, self.per_step)
        self.total_steps = sum(s for _, _, s in self.plans)
        if self.total_steps == 0:
            raise ValueError(
                f"{cfg.train_file}: {len(self.lengths)} samples give no full step of {self.per_step} "
                "batches; lower batch_tokens or add data"
            )
        self.sched = get_scheduler(
            LR_SCHEDULES[cfg.lr_schedule],
            self.opt,
            num_warmup_steps=max(1, round(cfg.warmup_ratio * self.total_steps)),
            num_training_steps=self.total_steps,
        )
        # step -> (epoch, its epoch's plan, index of its first batch within the epoch)
        self.where = [(e, plan, j) for e, plan, steps in self.plans for j in range(steps)]

    def restore(self) -> None:
        """Resume: the latest checkpoint of out_dir, if its recipe is this one; training seconds and tokens
        carried on (prior_tokens None: a checkpoint from before tokens were recorded)."""
        self.step, self.prior_s, self.prior_tokens = 0, 0.0, 0
        if not self.resume:
            return
        if self.is_main:
            remove_checkpoint_temps(self.out_dir)
        try:
            ck = find_checkpoint(self.out_dir)
        except FileNotFoundError:
            return
        check_same_recipe(ck, self.cfg)
        self.step = restore_checkpoint(ck, self.draft, self.opt, self.sched, self.device)
        state = json.loads((ck / "state.json").read_text())
        self.prior_s = float(state.get("train_elapsed_s", 0.0))
        self.prior_tokens = state.get("train_tokens_seen", None if self.prior_s else 0)
        if self.is_main:
            print(f"resumed from {ck} at step {self.step}/{self.total_steps}", flush=True)

    def report_setup(self) -> None:
        if not self.is_main:
            return
        cfg, n_params = self.cfg, sum(p.numel() for p in self.params)
        print(
            f"train {cfg.arch}: {len(self.lengths)} conversations ({self.train_stats}), {sum(self.lengths):,} tokens, "
            f"{n_params / 1e6:.1f}M trainable, vocab coverage {coverage(self.counts, self.draft_ids):.3f}, "
            f"{self.total_steps} steps x {self.per_step} micro-batches, world {self.world}, device {self.device}; "
            f"set-up {sum(self.phases.values()):.1f} s "
            f"({', '.join(f'{k} {v:.1f}' for k, v in self.phases.items())})\n{self.share}",
            flush=True,
        )

    # ---- the step loop
    def batch_tensors(self, indices, feature_fn):
        """One micro-batch: features, ids, valid, and the target's Targets at the assistant positions."""
        data = self.train_ds if feature_fn is self.feats else self.val_ds
        ids, valid, loss_mask = collate(data, indices, self.target.tokenizer.pad_token_id or 0, self.cfg.pad_multiple)
        pred_mask = F.pad((loss_mask & valid)[:, 1:], (0, 1))  # [B,L] on the CPU: token p+1 is an assistant token
        f, last = feature_fn(indices, ids, valid, self.device)
        ids, valid = ids.to(self.device, non_blocking=True), valid.to(self.device, non_blocking=True)
        with autocast(self.device):
            targets = targets_at(self.target, last.to(self.target.model.dtype), pred_mask, self.dids, self.t2d)
        return f, ids, valid, targets

    def valid_tokens(self, indices) -> int:
        """Real (non-padding) tokens of a micro-batch, from the lengths: no device sync."""
        return sum(self.lengths[k] for k in indices)

    def evaluate(self) -> dict:
        cfg, draft = self.cfg, self.draft
        draft.eval()
        stats = torch.zeros(cfg.ttt_steps, 4, device=self.device)
        vplan = plan_epoch([len(x) for x in self.val_ds["input_ids"]], cfg.batch_tokens, cfg.max_batch, cfg.seed, -1)
        with torch.no_grad(), autocast(self.device), attention_kernel(cfg.attention), self.objective.eager():
            for b in vplan[self.rank :: self.world]:
                stats += self.objective(*self.batch_tensors(b, self.feats_val))[1].float()
        _all_reduce(stats)
        draft.train()
        return summarize(stats.cpu(), cfg.step_decay)

    def where_now(self, epoch, j) -> dict:
        """What a checkpoint records besides the tensors: data position, training seconds and tokens so far."""
        return {
            "epoch": epoch,
            "batch_in_epoch": j + 1,
            "total_steps": self.total_steps,
            "train_elapsed_s": self.prior_s + time.time() - self.t0,
            "train_tokens_seen": self.tokens_so_far(),
        }

    def tokens_so_far(self) -> int | None:
        """Non-padding tokens trained on over every call of this run (None: an old checkpoint lacks them)."""
        return None if self.prior_tokens is None else self.prior_tokens + self.tok_seen * self.world

    def train_step(self, epoch, plan, j):
        """One optimizer step over this rank's grad_accum micro-batches; its summed stats."""
        cfg, world = self.cfg, self.world
        chunk = plan[j * self.per_step : (j + 1) * self.per_step]
        mine = [chunk[a * world + self.rank] for a in range(cfg.grad_accum)]
        step_stats = torch.zeros(cfg.ttt_steps, 4, device=self.device)
        for a, b in enumerate(mine):
            sync = self.model.no_sync() if (world > 1 and a < cfg.grad_accum - 1) else nullcontext()
            with sync, attention_kernel(cfg.attention):  # forward and backward inside one no_sync (usable once)
                tensors = self.batch_tensors(b, self.feats)
                with autocast(self.device):
                    loss, stats = self.model(*tensors)
                (loss / cfg.grad_accum).backward()
            step_stats += stats.float()
            self.tok_seen += self.valid_tokens(b)
        torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        return step_stats

    def after_step(self, epoch, plan, j) -> bool:
        """Log, evaluate and checkpoint on their schedules; False when stop_after ends this call."""
        cfg, step, total = self.cfg, self.step, self.total_steps
        if self.is_main and (step % cfg.log_every == 0 or step == total):
            dt = time.time() - self.t0
            row = {
                "step": step,
                "epoch": round(epoch + (j + 1) / max(1, len(plan) // self.per_step), 4),
                "lr": self.sched.get_last_lr()[0],
                **summarize(self.window, cfg.step_decay),
                "tokens_per_s": self.tok_seen * self.world / max(dt, 1e-9),
                "elapsed_s": dt,
            }
            self.logs.log("train", row)
            self.bar.set_postfix(loss=f"{row['loss']:.3f}", acc0=f"{row['acc_0']:.3f}")
            self.window.zero_()
        if self.val_ds is not None and (step % cfg.eval_every == 0 or step == total):
            self.last_eval = {"step": step, **self.evaluate()}
            if self.is_main:
                self.logs.log("eval", self.last_eval)
        if step % cfg.save_every == 0 or step == total:
            self.save(epoch, j)
        if self.world > 1 and step % cfg.save_every == 0:
            torch.distributed.barrier()
        if step < total and ((cfg.stop_after and step - self.started >= cfg.stop_after) or self.stop_asked()):
            self.save(epoch, j)
            if self.world > 1:  # no rank leaves before rank 0's checkpoint is written: once one rank exits
                torch.distributed.barrier()  # stopped, torchrun sends SIGTERM to the others (a second signal)
            return False
        return True

    def save(self, epoch, j) -> None:
        """A checkpoint of this step on rank 0 (once: a stop right after a scheduled save adds none)."""
        if self.is_main and self.saved != self.step:
            save_checkpoint(
                self.out_dir, self.step, self.draft, self.opt, self.sched, self.cfg, self.where_now(epoch, j)
            )
        self.saved = self.step

    def stop_asked(self) -> bool:
        """A signal came (core.stop). Several processes agree every step (each may get it at another step;
        the step loop syncs on its stats anyway), so that every rank stops at the same one. The answer is
        the agreed value, never a second read of `requested`: a signal landing just after the all-reduce
        would otherwise stop this rank alone, leaving the others in the next step's collectives."""
        if self.world == 1:
            self.halted = bool(self.stop)
            return self.halted
        asked = torch.tensor([float(self.stop.requested)], device=self.device)
        torch.distributed.all_reduce(asked, op=torch.distributed.ReduceOp.MAX)  # the signal any rank got
        agreed = int(asked.item())
        if agreed and not self.stop.requested:
            self.stop.requested = agreed  # for the one line that names the signal
        self.halted = bool(agreed)
        return self.halted

    def loop(self) -> None:
        cfg = self.cfg
        self.logs = Logs(self.out_dir, self.step) if self.is_main else None
        self.t2d, self.dids = self.draft.t2d, self.draft.draft_ids()
        self.draft.train()
        self.bar = tqdm(
            total=self.total_steps, initial=self.step, unit="step", desc=f"train {cfg.arch}", disable=not self.is_main
        )
        self.t0, self.tok_seen, self.window = time.time(), 0, torch.zeros(cfg.ttt_steps, 4)
        self.last_eval, self.started, self.saved, self.halted = None, self.step, self.step, False
        self.losses, self.supervised = [], 0.0  # this call's steps: what learned_nothing reads
        if self.val_ds is not None and self.step == 0:  # the untrained draft: the baseline of the curves
            self.last_eval = {"step": 0, **self.evaluate()}
            if self.is_main:
                self.logs.log("eval", self.last_eval)
                print(f"step-0 evaluation: {time.time() - self.t0:.1f} s", flush=True)
            self.t0 = time.time()
        try:
            while self.step < self.total_steps and not (self.step == self.started and self.stop_asked()):
                epoch, plan, j = self.where[self.step]
                stats = _all_reduce(self.train_step(epoch, plan, j)).cpu()  # [ttt_steps, 4] summed over ranks
                self.window += stats
                self.losses.append(summarize(stats, cfg.step_decay)["loss"])
                self.supervised += float(stats[:, 1].sum())
                self.bar.update(1)
                if not self.after_step(epoch, plan, j):
                    break
        finally:  # a forced stop too: its error line then starts a line of its own
            self.bar.close()

    def finish(self) -> dict:
        """The result (and summary.json on rank 0)."""
        if self.last_eval is None and self.val_ds is not None and self.step >= self.total_steps:
            self.last_eval = {"step": self.step, **self.evaluate()}  # resumed a finished run
        elapsed, tokens = time.time() - self.t0, self.tokens_so_far()
        result = {
            "draft": self.draft,
            "target": self.target,
            "out_dir": self.out_dir,
            "steps": self.step,
            "total_steps": self.total_steps,
            "finished": self.step >= self.total_steps,
            "eval": self.last_eval,
            "train_stats": self.train_stats,
            "val_stats": self.val_stats,
            "elapsed_s": elapsed,
            "elapsed_total_s": self.prior_s + elapsed,
            "resumed_from_step": self.started or None,
            "hidden_precompute_s": self.phases["hidden"],
            "tokens_per_s": self.tok_seen * self.world / max(elapsed, 1e-9),  # this call's (with its warm-up)
            "tokens_per_s_all_calls": None if tokens is None else tokens / max(self.prior_s + elapsed, 1e-9),
            "train_tokens": sum(self.lengths),
            "vocab_coverage": coverage(self.counts, self.draft_ids),
            "world": self.world,
            "learned_nothing": learned_nothing(self.losses, self.supervised),  # None, or why not one step taught
        }
        if self.is_main and self.cfg.compile:
            print(compile_report(), flush=True)  # into the row's train.log: where the first step's minute went
        if self.is_main:
            atomic_write_json(
                self.out_dir / "summary.json",
                {k: v for k, v in result.items() if k not in ("draft", "target", "out_dir")},
                indent=1,
            )
        return result
