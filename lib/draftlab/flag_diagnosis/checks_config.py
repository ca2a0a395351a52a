"""Checks of two config keys that change what the draft computes without changing a tensor's shape
(docs/eagle3-contract.md 2): the rotary embedding against the target's, and tie_word_embeddings (a tied draft
ignores its trained lm_head). No shape check catches either; acceptance falls instead.
"""

from __future__ import annotations

import json

from draftlab.flag_diagnosis.inputs import DraftFiles, Finding, TargetInfo, _config_fix


def _rope(cfg: dict) -> tuple:
    """(theta, scaling dict or None) from legacy keys or transformers 5's rope_parameters."""
    params = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    theta = cfg.get("rope_theta", params.get("rope_theta"))
    scaling = cfg.get("rope_scaling")
    if scaling is None and params.get("rope_type") not in (None, "default"):
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if isinstance(scaling, dict):
        scaling = {("rope_type" if k == "type" else k): v for k, v in scaling.items()}
        if scaling.get("rope_type") in (None, "default"):
            scaling = None
    return (float(theta) if theta is not None else None), scaling


def check_rope(d: DraftFiles, t: TargetInfo) -> list:
    where = str(d.config_path)
    out = []
    d_theta, d_scaling = _rope(d.config)
    t_theta, t_scaling = _rope(t.text)
    if "rope_theta" not in d.config and "rope_parameters" in d.config:
        out.append(
            Finding(
                "rope",
                "warning",
                "rope_theta is only inside rope_parameters (transformers 5 layout)",
                "SGLang's config reading (transformers 4.x) looks for the legacy rope_theta/rope_scaling keys and "
                "falls back to theta 10000 without them",
                _config_fix("rope_theta", d_theta)
                + (f' and "rope_scaling": {json.dumps(d_scaling)}' if d_scaling else ""),
                where,
            )
        )
    if d_theta is not None and t_theta is not None and abs(d_theta - t_theta) > 1e-6 * max(1.0, t_theta):
        out.append(
            Finding(
                "rope",
                "warning",
                f"draft rope_theta {d_theta:g} differs from the target's {t_theta:g}",
                "the draft attends over the target's positions; a different rotary base shifts every position "
                "the draft sees",
                _config_fix("rope_theta", t_theta) + " if the draft was trained with the target's rope",
                where,
            )
        )
    if (d_scaling or None) != (t_scaling or None):
        out.append(
            Finding(
                "rope",
                "warning",
                f"draft rope_scaling {d_scaling} differs from the target's {t_scaling}",
                "long-context scaling must match the positions the target serves, or draft quality drops past the "
                "original window",
                _config_fix("rope_scaling", t_scaling) + " if the draft was trained with the target's rope",
                where,
            )
        )
    if not out:
        out.append(
            Finding(
                "rope",
                "ok",
                f"rope theta {d_theta:g}, scaling {d_scaling} = target's" if d_theta else "rope as target's",
                where=where,
            )
        )
    return out


def check_tie_embeddings(d: DraftFiles) -> list:
    where = str(d.config_path)
    if d.config.get("tie_word_embeddings") is True:
        return [
            Finding(
                "tie_word_embeddings",
                "error",
                "tie_word_embeddings is true",
                "a tied draft takes its lm_head from the (shared, target-sized) embedding: the trained "
                "lm_head over the draft vocabulary is ignored",
                _config_fix("tie_word_embeddings", False),
                where,
            )
        ]
    return [
        Finding(
            "tie_word_embeddings",
            "ok",
            f"tie_word_embeddings {d.config.get('tie_word_embeddings', False)}",
            where=where,
        )
    ]
