"""Checks of the draft vocabulary: draft_vocab_size, d2t (draft -> target ids) and t2d (docs/eagle3-contract.md 1).

A wrong mapping loads without complaint and drafts the wrong tokens: acceptance drops, no error.
"""

from __future__ import annotations

from draftlab.flag_diagnosis.inputs import (
    DraftFiles,
    Finding,
    TargetInfo,
    _config_fix,
)

# ---------------------------------------------------------------------------------------------
# Checks: each returns a list of Findings (an "ok" Finding when it passed)
# ---------------------------------------------------------------------------------------------


def check_vocab(d: DraftFiles, t: TargetInfo) -> list:
    """vocab_size vs target, draft_vocab_size vs d2t and lm_head, t2d vs the target vocabulary."""
    where_cfg, where_w = str(d.config_path), str(d.weight_files[0])
    out = []
    v = d.config.get("vocab_size")
    if v != t.vocab_size:
        out.append(
            Finding(
                "vocab_size",
                "error",
                f"draft vocab_size {v} differs from the target's {t.vocab_size}",
                "the draft shares the target's embedding and maps draft ids into the target vocabulary",
                _config_fix("vocab_size", t.vocab_size) + " (and rebuild d2t/t2d for this target)",
                where_cfg,
            )
        )
    else:
        out.append(Finding("vocab_size", "ok", f"vocab_size {v} = target's", where=where_cfg))
    vd = d.config.get("draft_vocab_size")
    lm = d.tensors.get("lm_head.weight", ((None,), ""))[0]
    d2t_len = d.tensors["d2t"][0][0] if "d2t" in d.tensors and d.tensors["d2t"][0] else None
    if vd is None:
        out.append(
            Finding(
                "draft_vocab",
                "error" if lm[0] != v else "warning",
                "draft_vocab_size is missing from config.json",
                f"SGLang then sizes lm_head by vocab_size ({v}); the exported lm_head has {lm[0]} rows",
                _config_fix("draft_vocab_size", lm[0] if lm[0] is not None else d2t_len),
                where_cfg,
            )
        )
    else:
        problems = []
        if d2t_len is not None and d2t_len != vd:
            problems.append(f"d2t has {d2t_len} entries")
        if lm[0] is not None and lm[0] != vd:
            problems.append(f"lm_head.weight has {lm[0]} rows")
        if problems:
            out.append(
                Finding(
                    "draft_vocab",
                    "error",
                    f"draft_vocab_size is {vd} but " + " and ".join(problems),
                    "lm_head is allocated with draft_vocab_size rows and d2t maps each of them: a mismatch fails at "
                    "start-up or maps draft tokens to the wrong target tokens",
                    _config_fix("draft_vocab_size", lm[0] if lm[0] is not None else d2t_len)
                    + " (the size the draft was "
                    "trained with)",
                    where_cfg,
                )
            )
        else:
            out.append(
                Finding("draft_vocab", "ok", f"draft_vocab_size {vd} = d2t length = lm_head rows", where=where_cfg)
            )
    if "t2d" in d.tensors:
        t2d_len = d.tensors["t2d"][0][0] if d.tensors["t2d"][0] else None
        if t2d_len != t.vocab_size:
            out.append(
                Finding(
                    "t2d_size",
                    "error",
                    f"t2d has {t2d_len} entries, the target vocabulary {t.vocab_size}",
                    "t2d marks which target tokens the draft can propose; its length must be the target's vocabulary",
                    f"rebuild t2d as a bool tensor of {t.vocab_size} entries (true at target ids draft_id + "
                    "d2t[draft_id])",
                    where_w,
                )
            )
        else:
            out.append(Finding("t2d_size", "ok", f"t2d has {t2d_len} entries = target vocabulary", where=where_w))
    return out


def check_d2t_mapping(d: DraftFiles, t: TargetInfo) -> list:
    """d2t must map every draft id to a distinct, valid target id; t2d must agree with it."""
    import torch

    where = str(d.weight_files[0])
    if d.d2t is None:
        return []  # a missing d2t is reported by check_tensor_names
    out = []
    d2t = d.d2t
    if d2t.dtype != torch.int64:
        out.append(
            Finding(
                "d2t_mapping",
                "warning",
                f"d2t is {d2t.dtype}, the contract says int64",
                "SGLang adds d2t to int64 ids; other dtypes are converted or overflow on large vocabularies",
                "save d2t as torch.int64",
                where,
            )
        )
    target_ids = torch.arange(d2t.numel(), dtype=torch.int64) + d2t.to(torch.int64)  # [Vd]
    bad = ((target_ids < 0) | (target_ids >= t.vocab_size)).nonzero().flatten()
    dup = target_ids.numel() - torch.unique(target_ids).numel()
    if bad.numel() or dup:
        parts = []
        if bad.numel():
            first = int(bad[0])
            parts.append(
                f"{bad.numel()} draft ids map outside 0..{t.vocab_size - 1} (e.g. draft id {first} -> "
                f"{int(target_ids[first])})"
            )
        if dup:
            parts.append(f"{dup} target ids are reached by more than one draft id")
        out.append(
            Finding(
                "d2t_mapping",
                "error",
                "d2t is not a valid offset map: " + "; ".join(parts),
                "SGLang proposes target id draft_id + d2t[draft_id]: invalid ids crash the sampler or propose tokens "
                "the verifier always rejects",
                "rebuild d2t as sorted_target_ids - arange(Vd) from the draft vocabulary (target ids sorted ascending)",
                where,
            )
        )
        return out
    if not bool((target_ids[1:] > target_ids[:-1]).all()):
        out.append(
            Finding(
                "d2t_mapping",
                "warning",
                "d2t maps draft ids to target ids out of ascending order",
                "the contract's draft vocabulary is sorted by target id; an unsorted map suggests a different build",
                "rebuild d2t from the target ids sorted ascending",
                where,
            )
        )
    if d.t2d is not None and d.t2d.numel() == t.vocab_size:
        t2d = d.t2d.to(torch.bool)
        agree = bool(t2d[target_ids].all()) and int(t2d.sum()) == target_ids.numel()
        if not agree:
            out.append(
                Finding(
                    "d2t_mapping",
                    "warning",
                    f"t2d marks {int(t2d.sum())} target tokens but d2t reaches {target_ids.numel()} (or others)",
                    "t2d and d2t describe the same vocabulary; disagreement means one of them is from another export",
                    "rebuild t2d: t2d = zeros(V, bool); t2d[arange(Vd) + d2t] = True",
                    where,
                )
            )
    if not out:
        out.append(
            Finding(
                "d2t_mapping",
                "ok",
                f"d2t maps {target_ids.numel()} draft ids to distinct valid target ids",
                where=where,
            )
        )
    return out
