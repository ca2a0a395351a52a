"""Notebook 04's orchestration: its inputs, both drafts trained (side by side or in turn), exported and checked.

The notebook keeps its parameters, tables and figures; the decisions (a held-out split when
notebook 03 wrote no val.jsonl, the fallback from side-by-side training to one after the other,
export right after each training) live here, where tests run them.
"""

from __future__ import annotations

from pathlib import Path

from draftlab.core.run_folder import RunFolder
from draftlab.model.chat_data import split_holdout
from draftlab.model.export import export_draft, validate
from draftlab.train_draft.config import TrainConfig
from draftlab.train_draft.guards import refuse_if_learned_nothing
from draftlab.train_draft.loop import train
from draftlab.train_draft.parallel import train_side_by_side


def training_inputs(run_dir, val_samples: int, seed: int) -> tuple[Path, Path]:
    """(train.jsonl, val.jsonl) of notebook 03; without a val.jsonl, `val_samples` rows held out (seeded)."""
    regen = RunFolder(run_dir).regen
    if not (regen / "train.jsonl").is_file():
        raise FileNotFoundError(f"{regen / 'train.jsonl'}: missing; run notebook 03_regenerate first")
    train_file, val_file = regen / "train.jsonl", regen / "val.jsonl"
    if not val_file.is_file():
        train_file, val_file = split_holdout(train_file, val_samples, Path(run_dir) / "train" / "holdout", seed)
    return train_file, val_file


def train_configs(run_dir, archs, recipe: dict) -> dict:
    """One TrainConfig per architecture, each in RUN_DIR/train/<arch>; a setting that is None (or absent)
    is TrainConfig's, the best measured recipe. The norm before fc (fc_norm) goes to eagle3 only, the one
    architecture with an fc."""
    recipe = {k: v for k, v in recipe.items() if v is not None}

    def for_arch(arch):
        return {**recipe, "fc_norm": recipe.get("fc_norm", "auto") if arch == "eagle3" else "none"}

    return {
        arch: TrainConfig(**for_arch(arch), arch=arch, out_dir=str(Path(run_dir) / "train" / arch)) for arch in archs
    }


def train_and_export(configs: dict, target, run_dir, side_by_side: bool, resume: bool, export_dtype: str):
    """Train every config and export it to RUN_DIR/drafts/<arch>: (results, contract deviations) by arch.

    side_by_side: one process per arch on the same device; if that fails, the rest are trained one
    after the other here (resume picks up the checkpoints the children left)."""
    results, exports = {}, {}
    if side_by_side and len(configs) > 1:
        try:
            results = train_side_by_side(list(configs.values()), resume=resume, target=target)
        except RuntimeError as exc:
            print(f"side-by-side training failed; training one after the other: {str(exc)[:1500]}")
    for arch, cfg in configs.items():
        if arch not in results:  # one after the other, each exported as soon as it is trained
            results[arch] = train(cfg, resume=resume, target=target)
        refuse_if_learned_nothing(results[arch])
        out = RunFolder(run_dir).draft(arch)
        export_draft(
            results[arch]["draft"], out, max_position_embeddings=target.max_position_embeddings, dtype=export_dtype
        )
        exports[arch] = validate(out, target, allow_eagle1=arch == "eagle1")
        verdict = "conforms to the contract" if not exports[arch] else str(exports[arch])
        print(f"{arch}: exported to {out}: {verdict}")
    return results, exports


def summary(results: dict) -> dict:
    """The notebook's table: one column per arch."""
    return {
        arch: {
            "steps": r["steps"],
            "train conversations": r["train_stats"]["kept"],
            "truncated": r["train_stats"]["truncated"],
            "dropped (overlong / no assistant)": f"{r['train_stats']['dropped_overlong']} / "
            f"{r['train_stats']['dropped_no_assistant']}",
            "train tokens": r["train_tokens"],
            "vocab coverage": round(r["vocab_coverage"], 4),
            "wall s (this call)": round(r["elapsed_s"], 1),
            "wall s (all calls)": round(r["elapsed_total_s"], 1),
            **{k: round(v, 4) for k, v in (r["eval"] or {}).items() if k != "step"},
        }
        for arch, r in results.items()
    }


def metrics(results: dict, exports: dict, run_dir, settings: dict) -> dict:
    """metrics.json's 04 section, per arch."""
    return {
        arch: {
            "eval": r["eval"],
            "steps": r["steps"],
            "finished": r["finished"],
            "train_stats": r["train_stats"],
            "val_stats": r["val_stats"],
            "train_tokens": r["train_tokens"],
            "vocab_coverage": r["vocab_coverage"],
            "elapsed_s": r["elapsed_s"],
            "elapsed_total_s": r["elapsed_total_s"],
            "resumed_from_step": r["resumed_from_step"],
            "tokens_per_s": r["tokens_per_s"],
            "export_dir": str(RunFolder(run_dir).draft(arch)),
            "export_deviations": exports[arch],
            "settings": settings,
        }
        for arch, r in results.items()
    }
