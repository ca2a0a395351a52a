"""The study itself: train a draft per (architecture, subset size), resumable; a signal stops it cleanly."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from draftlab.core.records import append_jsonl
from draftlab.core.run_folder import RunFolder
from draftlab.core.stop import graceful_stop
from draftlab.data_scaling.evaluate import (
    HeldOut,
    chain_acceptance,
    heldout_prompts,
    load_val,
    simulated_acceptance,
)
from draftlab.data_scaling.plan import (
    ARCHS,
    RECIPE_KEYS,
    ScalingError,
    StudyPlan,
    done_keys,
    load_results,
    recipe_from_04,
    settings_key,
)
from draftlab.model.draft import load_draft
from draftlab.model.export import export_draft
from draftlab.train_draft import TrainConfig, train
from draftlab.train_draft.guards import refuse_if_learned_nothing
from draftlab.train_draft.parallel import train_side_by_side

# ---------------------------------------------------------------------------------- the study


@dataclass
class StudySettings:
    """Everything the study runs with besides the data (the notebook's parameters)."""

    archs: list = field(default_factory=lambda: list(ARCHS))
    train: dict = field(default_factory=dict)  # TrainConfig fields of the recipe (RECIPE_KEYS and more)
    hidden: str = "online"  # offline: each subset's target states computed once, shared by both archs
    val_samples: int = 256
    spec_prompts: int = 0  # 0: no real chain decoding
    spec_steps: int = 6
    spec_max_new_tokens: int = 128
    seed: int = 0
    side_by_side: bool = False  # train a subset's archs at once, one process each (hidden online)

    def eval_settings(self) -> dict:
        return {
            "val_samples": self.val_samples,
            "spec_prompts": self.spec_prompts,
            "spec_steps": self.spec_steps,
            "spec_max_new_tokens": self.spec_max_new_tokens,
        }


def study_settings(
    run_dir,
    *,
    from_04: bool,
    archs,
    epochs,
    draft_vocab_size,
    max_len,
    ttt_steps,
    batch_tokens,
    max_batch,
    lr,
    checkpoint_every,
    val_samples,
    spec_prompts,
    spec_steps,
    spec_max_new_tokens,
    seed,
    threads: int = 2,
    intermediate_size: int = 0,
    hidden: str = "online",
    side_by_side: bool = False,
) -> tuple[StudySettings, list[str]]:
    """The notebook's parameters as StudySettings; with from_04 the recipe is notebook 04's own (its
    checkpoint's TrainConfig), so that 04's drafts are the study's largest points."""
    train = {
        "epochs": float(epochs),
        "draft_vocab_size": int(draft_vocab_size),
        "max_len": int(max_len),
        "ttt_steps": int(ttt_steps),
        "batch_tokens": int(batch_tokens),
        "max_batch": int(max_batch),
        "lr": float(lr),
        "save_every": int(checkpoint_every),
        "threads": int(threads),
        "intermediate_size": int(intermediate_size),
    }
    if hidden not in ("online", "offline"):
        raise ScalingError(f"HIDDEN = {hidden!r}: expected online or offline")
    notes = []
    if from_04:
        theirs = recipe_from_04(run_dir, "eagle3")
        if theirs is None:
            notes.append("RECIPE_FROM_04: no checkpoint under RUN_DIR/train/eagle3; using this notebook's recipe")
        else:
            changed = {k: v for k, v in theirs.items() if train.get(k) != v}
            train.update(theirs)
            notes.append(f"recipe taken from 04: {changed}")
    return StudySettings(
        archs=list(archs),
        train=train,
        hidden=hidden,
        val_samples=int(val_samples),
        spec_prompts=int(spec_prompts),
        spec_steps=int(spec_steps),
        spec_max_new_tokens=int(spec_max_new_tokens),
        seed=int(seed),
        side_by_side=bool(side_by_side) and hidden == "online",
    ), notes


def work_items(plan: StudyPlan, settings: StudySettings) -> list[tuple[str, int]]:
    """(arch, n) in the order they run: smallest subsets first, architectures interleaved, so a
    run stopped early still yields comparable points for both."""
    for a in settings.archs:
        if a not in ARCHS:
            raise ScalingError(f"ARCHS: {a!r} is not one of {ARCHS}")
    return [(a, n) for n in plan.sizes for a in settings.archs]


def run_study(
    target,
    target_spec: str,
    device: str,
    plan: StudyPlan,
    out_dir,
    settings: StudySettings,
    extra_points: list[dict] | None = None,
    progress: bool = True,
) -> dict:
    """Train + measure every (arch, n) not yet done; each result is appended to results.jsonl at once.

    extra_points: already-trained drafts to measure the same way (e.g. notebook 04's, trained on
    all the data with the same recipe): dicts with arch, n, draft_dir, source.
    Returns {"results": rows for this plan's settings, "deferred": items left for a rerun, ...}.
    A first SIGTERM/SIGINT ends the subset's training step with a checkpoint (or lets a measurement
    finish) and raises core.stop.Stopped; a rerun continues with the subsets not in results.jsonl.
    """
    with graceful_stop("rerun to continue: finished subsets are kept in results.jsonl") as stop:
        return _run_study(target, target_spec, device, plan, out_dir, settings, extra_points, progress, stop)


def _run_study(target, target_spec, device, plan, out_dir, settings, extra_points, progress, stop) -> dict:
    out = Path(out_dir)
    # the recipe as a TrainConfig: its defaults where settings.train gives none
    train_cfg = TrainConfig(**{k: v for k, v in settings.train.items() if k in TrainConfig.__dataclass_fields__})
    results_path = out / "results.jsonl"
    t_start = time.monotonic()
    if str(device).startswith("cpu"):
        import torch

        torch.set_num_threads(max(1, int(train_cfg.threads)))
    ev = settings.eval_settings()
    val_ds, val_stats = load_val(
        plan.val_file, target.tokenizer, train_cfg.max_len, train_cfg.overlong, out / "tokens", settings.val_samples
    )
    held = HeldOut(target, val_ds, train_cfg.capture_layers or target.capture_layers, progress)
    prompts = heldout_prompts(target, plan.val_file, settings.spec_prompts) if settings.spec_prompts else None
    have = done_keys(results_path)
    deferred, ran = [], []

    def measure(arch, n, draft_dir, source, extra):
        """Every point is measured from its exported folder (bf16 weights, as a server loads them)."""
        t0 = time.monotonic()
        draft = load_draft(draft_dir, target)
        sim = simulated_acceptance(
            target, draft, held, train_cfg.ttt_steps, train_cfg.step_decay, seed=settings.seed, progress=progress
        )
        row = {
            "arch": arch,
            "n": n,
            "source": source,
            "sim_accept_len": sim["sim_accept_len"],
            "sim_accept_len_se": sim["sim_accept_len_se"],
            "acc": [sim[f"acc_{i}"] for i in range(train_cfg.ttt_steps)],
            "val_conversations": sim["conversations"],
            "val_scored_tokens": sim["scored_tokens"],
            **extra,
        }
        if prompts:
            ch = chain_acceptance(
                target,
                draft_dir,
                prompts,
                settings.spec_steps,
                settings.spec_max_new_tokens,
                seed=settings.seed,
                progress=progress,
            )
            row.update({f"chain_{k}": v for k, v in ch.items()})
        row["eval_s"] = round(time.monotonic() - t0, 2)
        del draft
        _free_cuda()
        return row

    recipe = {**settings.train, "train_file_rows": plan.available}

    def item_key(arch, n):
        """The result key of a subset trained with this study's recipe and evaluation."""
        return settings_key(arch, n, recipe, ev)

    def subset_config(arch, n):
        """(TrainConfig, folder) of one subset; one folder per recipe (train.py refuses to resume a
        checkpoint made with other settings)."""
        sub = out / arch / f"n{n}-{settings_key(arch, n, recipe, {})}"
        cfg = TrainConfig.from_dict(
            {
                **settings.train,
                "train_file": str(plan.train_file),
                "val_file": "",
                "out_dir": str(sub / "train"),
                "target": target_spec,
                "arch": arch,
                "device": device,
                "max_train_samples": n,
                "hidden": settings.hidden,
                "hidden_dir": str(out / "hidden" / f"n{n}"),
                "seed": settings.seed,
            }
        )
        return cfg, sub

    items = work_items(plan, settings)
    trained_together: dict = {}  # (arch, n) -> result of a side-by-side training, not yet measured
    for arch, n in items:
        key = item_key(arch, n)
        if key in have:
            continue
        if stop:
            stop.stopped(f"scaling study {out}: {len(ran)} subsets done in this call, before {arch} n={n}")
        cfg, sub = subset_config(arch, n)
        t0 = time.monotonic()
        if settings.side_by_side and (arch, n) not in trained_together:
            group = [a for a, m in items if m == n and item_key(a, m) not in have]
            if len(group) > 1:
                try:
                    together = train_side_by_side([subset_config(a, n)[0] for a in group], resume=True, target=target)
                    trained_together.update({(a, n): (together[a], time.monotonic() - t0) for a in group})
                except RuntimeError as exc:  # one after the other instead, resuming their checkpoints
                    print(f"side-by-side training failed; training one after the other: {str(exc)[:1500]}")
        together = (arch, n) in trained_together
        if together:
            res, train_s = trained_together.pop((arch, n))  # the group's wall time, shared
        else:
            res = train(cfg, resume=True, target=target)
            train_s = time.monotonic() - t0
        refuse_if_learned_nothing(res)  # as `draftlab train` and notebook 04 do, before anything is exported
        t_trained = time.monotonic()
        if not res["finished"]:
            deferred.append((arch, n))
            continue
        draft_dir = sub / "draft"
        export_draft(res["draft"], draft_dir, max_position_embeddings=target.max_position_embeddings)
        kept = res["train_stats"]["kept"]  # rows actually trained on (tokenisation may drop some)
        extra = {
            "key": key,
            "n_requested": n,
            "train_s": round(train_s, 2),
            "side_by_side": together,
            "train_tokens": res["train_tokens"],
            "train_rows": kept,
            "steps": res["steps"],
            "train_tokens_per_s": res["tokens_per_s"],
            "vocab_coverage": res["vocab_coverage"],
            "draft_dir": str(draft_dir),
        }
        del res
        _free_cuda()
        row = measure(arch, kept, draft_dir, "scaling", extra)
        row["wall_s"] = round(train_s + time.monotonic() - t_trained, 2)
        append_jsonl(results_path, [row])
        ran.append((arch, n))

    for point in extra_points or []:
        key = settings_key(
            point["arch"], point["n"], {"draft_dir": str(point["draft_dir"]), "source": point["source"]}, ev
        )
        if key in done_keys(results_path):
            continue
        if stop:
            stop.stopped(f"scaling study {out}: the extra points, before {point['draft_dir']}")
        row = measure(
            point["arch"],
            point["n"],
            point["draft_dir"],
            point["source"],
            {"key": key, "draft_dir": str(point["draft_dir"]), **point.get("meta", {})},
        )
        append_jsonl(results_path, [row])

    keys = {item_key(a, n) for a, n in items}
    keys |= {
        settings_key(p["arch"], p["n"], {"draft_dir": str(p["draft_dir"]), "source": p["source"]}, ev)
        for p in extra_points or []
    }
    rows = [r for r in load_results(results_path) if r["key"] in keys]
    return {
        "results": rows,
        "deferred": deferred,
        "ran_now": ran,
        "val_stats": val_stats,
        "wall_s": round(time.monotonic() - t_start, 1),
    }


def _free_cuda() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def points_from_04(run_dir, recipe: dict, include: bool = True) -> tuple[list[dict], list[str]]:
    """Notebook 04's exported drafts as extra points (n = the rows it trained on), when its recipe
    equals the study's; otherwise none, and a note saying which setting differs. include=False
    (07's INCLUDE_04_DRAFTS): none, without notes."""
    points, notes = [], []
    for arch in ARCHS if include else ():
        draft_dir = RunFolder(run_dir).draft(arch)
        summary = Path(run_dir) / "train" / arch / "summary.json"
        if not (draft_dir / "config.json").is_file() or not summary.is_file():
            notes.append(f"04 {arch}: no {draft_dir} or {summary}; not included")
            continue
        theirs = recipe_from_04(run_dir, arch) or {}
        differ = sorted(k for k in RECIPE_KEYS if k in theirs and k in recipe and theirs[k] != recipe[k])
        if differ:
            notes.append(f"04 {arch}: recipe differs in {differ}; not included in the curve")
            continue
        info = json.loads(summary.read_text())
        if not info.get("finished", True):
            notes.append(f"04 {arch}: training did not finish; not included")
            continue
        points.append(
            {
                "arch": arch,
                "n": int(info["train_stats"]["kept"]),
                "draft_dir": draft_dir,
                "source": "04",
                "meta": {
                    "train_s": info.get("elapsed_s"),
                    "train_tokens": info.get("train_tokens"),
                    "train_rows": info["train_stats"]["kept"],
                },
            }
        )
    return points, notes
