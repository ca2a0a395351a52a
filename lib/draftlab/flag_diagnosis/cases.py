"""A library of broken drafts and launch commands, one per doctor check, built from a good export.

Tests assert that doctor flags each case with the right finding; notebook 05 runs doctor on them
live. Every case is a copy of one good export with a single thing broken the way it breaks in
practice (a wrong flag, a prefixed name, a config copied from another model...).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from draftlab.core.run_folder import RunFolder
from draftlab.flag_diagnosis.doctor import diagnose, wide_table
from draftlab.flag_diagnosis.inputs import load_target_info
from draftlab.model.draft import Eagle3Draft, draft_config_for_target
from draftlab.model.export import export_draft
from draftlab.sglang.commands import sglang_speculative_command, sglang_target_command
from draftlab.sglang.launch import set_flag


def good_draft(
    folder, target_spec: str = "tiny", draft_vocab_size: int = 512, seed: int = 0, sglang_ids: bool = True
) -> Path:
    """A contract-correct export for `target_spec` (random weights) via draftlab.model.draft + draftlab.model.export.

    sglang_ids: True keeps what draftlab.model.export writes (SGLang's output-of-layer config ids, SGLang adds 1,
    with the trained hidden_states indices recorded under "draftlab"); False rewrites it the way a
    naive exporter would (the input-of-layer ids themselves, nothing recorded).
    """
    from transformers import AutoConfig

    info = load_target_info(target_spec)
    tconf = AutoConfig.from_pretrained(info.config_path.parent)
    torch.manual_seed(seed)
    cfg = draft_config_for_target(tconf, draft_vocab_size=draft_vocab_size)
    draft = Eagle3Draft(cfg, torch.nn.Embedding(info.vocab_size, info.hidden_size))
    draft.set_vocab(torch.randperm(info.vocab_size)[:draft_vocab_size].sort().values)
    folder = Path(folder)
    export_draft(draft, folder, max_position_embeddings=info.max_position_embeddings, dtype="float32")
    if not sglang_ids:
        trained = list(draft.capture_layers)
        edit_config(
            folder,
            lambda c: (
                c.update(eagle_config={**c["eagle_config"], "eagle_aux_hidden_state_layer_ids": trained}),
                c.pop("draftlab", None),
            ),
        )
    return folder


def edit_config(folder, fn) -> None:
    """Apply fn(config dict) in place to folder/config.json."""
    path = Path(folder) / "config.json"
    cfg = json.loads(path.read_text())
    fn(cfg)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def edit_tensors(folder, fn) -> None:
    """Apply fn(name -> tensor dict) in place to folder/model.safetensors."""
    from safetensors.torch import load_file, save_file

    path = Path(folder) / "model.safetensors"
    tensors = load_file(str(path))
    fn(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


@dataclass
class Case:
    """One broken input and the finding doctor must report for it."""

    name: str
    check: str  # the Finding.check that must fire
    severity: str  # its severity
    story: str  # what was broken, in one line
    target: str
    draft: Path | None = None
    launches: list = field(default_factory=list)


def _copy(good: Path, out: Path, name: str) -> Path:
    dst = out / name
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(good, dst)
    return dst


def _pop(key):
    return lambda c: c.pop(key, None)


def build_cases(good, out, target: str = "tiny", deepseek_target: str | None = None) -> list:
    """Write one broken copy of `good` per check under `out`; returns the Cases (plus the good one first).

    target: the target `good` was exported for; deepseek_target: a DeepSeek-family config with the
    same widths (data/configs/deepseek-tiny) for the capture-layer quirk.
    """
    good, out = Path(good), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    info = load_target_info(target)
    h = info.hidden_size
    model = str(info.config_path.parent)
    cfg = json.loads((good / "config.json").read_text())
    trained = (cfg.get("draftlab") or {}).get("capture_layers") or info.default_capture
    spec = sglang_speculative_command(model, str(good), algorithm="EAGLE3", num_steps=3, topk=1)
    cases = [
        Case(
            "good",
            "",
            "",
            "a correct export, served with EAGLE3 next to a baseline with equal batch cap",
            target,
            good,
            [spec, sglang_target_command(model, max_running_requests=48)],
        )
    ]

    def draft_case(name, check, severity, story, config_fn=None, tensor_fn=None, case_target=None):
        d = _copy(good, out, name)
        if config_fn:
            edit_config(d, config_fn)
        if tensor_fn:
            edit_tensors(d, tensor_fn)
        cases.append(Case(name, check, severity, story, case_target or target, d))

    # --- flags
    cases.append(
        Case(
            "flag_eagle",
            "algorithm",
            "error",
            "the EAGLE-3 draft served with --speculative-algorithm EAGLE",
            target,
            good,
            [set_flag(spec, "--speculative-algorithm", "EAGLE")],
        )
    )
    cases.append(
        Case(
            "topk1_draft_tokens",
            "topk_draft_tokens",
            "warning",
            "topk 1, 3 steps, but 8 draft tokens",
            target,
            None,
            [set_flag(spec, "--speculative-num-draft-tokens", 8)],
        )
    )
    cases.append(
        Case(
            "unequal_batch_cap",
            "max_running_requests",
            "error",
            "baseline without --max-running-requests (sized from memory) vs the speculative server's 48",
            target,
            None,
            [sglang_target_command(model), spec],
        )
    )
    # --- widths
    draft_case(
        "fc_eagle1_width",
        "fc_width",
        "error",
        "fc.weight exported 2H wide (an EAGLE-1-era fc)",
        tensor_fn=lambda t: t.update({"fc.weight": torch.zeros(h, 2 * h)}),
    )
    draft_case(
        "hidden_from_other_target",
        "hidden_size",
        "error",
        "config.json copied from a 2x wider target",
        config_fn=lambda c: c.update(hidden_size=2 * h),
    )
    # --- norms before fc (EAGLE 3.1): SGLang reads the config key and the tensors independently
    draft_case(
        "fc_norm_without_tensors",
        "fc_norm",
        "error",
        "fc_norm: true in config.json, no fc_norm.{0,1,2}.weight exported (SGLang runs them at weight 1)",
        config_fn=lambda c: c.update(fc_norm=True),
    )
    draft_case(
        "norm_tensor_without_key",
        "fc_norm",
        "error",
        "input_norm.weight exported without norm_before_fc (SGLang skips it silently)",
        tensor_fn=lambda t: t.update({"input_norm.weight": torch.ones(3 * h)}),
    )
    # --- capture layers
    draft_case(
        "no_eagle_config",
        "capture_layers_present",
        "warning",
        "eagle_config left out of config.json",
        config_fn=_pop("eagle_config"),
    )
    draft_case(
        "layer_out_of_range",
        "capture_layers_range",
        "error",
        f"capture ids past the last of the target's {info.num_layers} layers",
        config_fn=lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[1, 3, info.num_layers + 1]),
    )
    draft_case(
        "input_of_layer_ids",
        "capture_layers_convention",
        "warning",
        "input-of-layer ids written where SGLang expects output-of-layer ids (a naive exporter's mistake)",
        config_fn=lambda c: (
            c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=list(trained)),
            c.pop("draftlab", None),
        ),
    )
    draft_case(
        "trained_layers_shifted",
        "capture_layers_convention",
        "error",
        "recorded training layers and config ids disagree by one",
        config_fn=lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=list(trained)),
    )
    if deepseek_target:
        shifted = [i + 1 for i in trained]
        draft_case(
            "deepseek_offset",
            "capture_layers_deepseek",
            "error",
            "output-of-layer ids whose first id is not 1 on a DeepSeek-family target (used as-is)",
            config_fn=lambda c: (
                c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=list(trained)),
                c.update(draftlab={"capture_layers": shifted}),
            ),
            case_target=deepseek_target,
        )
    # --- vocabulary
    draft_case(
        "draft_vocab_size_wrong",
        "draft_vocab",
        "error",
        "draft_vocab_size says 32000, d2t and lm_head have fewer",
        config_fn=lambda c: c.update(draft_vocab_size=32000),
    )
    draft_case(
        "vocab_from_other_target",
        "vocab_size",
        "error",
        "config.json says vocab_size 32000 (another tokenizer)",
        config_fn=lambda c: c.update(vocab_size=32000),
    )
    draft_case(
        "t2d_wrong_length",
        "t2d_size",
        "error",
        "t2d built for a 32000-token vocabulary",
        tensor_fn=lambda t: t.update({"t2d": torch.zeros(32000, dtype=torch.bool)}),
    )
    draft_case(
        "d2t_out_of_range",
        "d2t_mapping",
        "error",
        "d2t stores target ids instead of offsets",
        tensor_fn=lambda t: t.update({"d2t": t["d2t"] + torch.arange(t["d2t"].numel())}),
    )
    # --- config fields
    draft_case(
        "short_context",
        "context_length",
        "error",
        "max_position_embeddings smaller than the served context",
        config_fn=lambda c: c.update(max_position_embeddings=256),
    )
    draft_case(
        "tied_embeddings",
        "tie_word_embeddings",
        "error",
        "tie_word_embeddings true (copied from the target)",
        config_fn=lambda c: c.update(tie_word_embeddings=True),
    )
    draft_case(
        "plain_llama_arch",
        "architectures",
        "error",
        "architectures LlamaForCausalLM",
        config_fn=lambda c: c.update(architectures=["LlamaForCausalLM"]),
    )
    draft_case(
        "rope_theta_default",
        "rope",
        "warning",
        "rope_theta 10000 where the target uses another base",
        config_fn=lambda c: c.update(rope_theta=10000.0 if float(c.get("rope_theta", 0)) != 10000.0 else 500000.0),
    )
    draft_case(
        "rope_only_new_keys",
        "rope",
        "warning",
        "only transformers 5's rope_parameters, no legacy rope_theta",
        config_fn=lambda c: (
            c.pop("rope_theta", None),
            c.setdefault("rope_parameters", {"rope_type": "default", "rope_theta": 1e5}),
        ),
    )
    # --- tensor names
    draft_case(
        "prefixed_names",
        "unknown_tensors",
        "error",
        "every tensor saved as draft_model.<name>",
        tensor_fn=lambda t: [t.__setitem__("draft_model." + k, t.pop(k)) for k in list(t) if k not in ("d2t", "t2d")],
    )
    draft_case(
        "missing_hidden_norm",
        "missing_tensors",
        "error",
        "midlayer.hidden_norm.weight not exported",
        tensor_fn=lambda t: t.pop("midlayer.hidden_norm.weight"),
    )
    draft_case(
        "qproj_one_h",
        "tensor_shapes",
        "error",
        "q_proj takes H inputs instead of 2H",
        tensor_fn=lambda t: t.update(
            {"midlayer.self_attn.q_proj.weight": t["midlayer.self_attn.q_proj.weight"][:, :h].contiguous()}
        ),
    )
    return cases


def draft_for_run(run_dir, target_spec: str, build_if_missing: bool, out_dir) -> tuple:
    """(folder, origin) of the draft notebook 05 checks: RUN_DIR/drafts/eagle3 from notebook 04.

    When it is missing: with build_if_missing (smoke) an untrained export for the target is written
    to out_dir with draftlab.model.export (its acceptance lengths mean nothing); otherwise a clear error.
    """
    folder = RunFolder(run_dir).draft("eagle3")
    if (folder / "config.json").is_file():
        return folder, "trained by notebook 04"
    if not build_if_missing:
        raise FileNotFoundError(
            f"{folder}: no exported draft; run notebook 04_train_draft first "
            "(or set BUILD_DRAFT_IF_MISSING = True for an untrained one)"
        )
    out = Path(out_dir) / "untrained_eagle3"
    if not (out / "config.json").is_file():
        good_draft(out, target_spec, draft_vocab_size=512)
    return out, "untrained (random weights), built by draftlab.model.export because notebook 04 has not run"


def run_library(cases) -> pd.DataFrame:
    """doctor on every case: did the expected finding fire, and what fix did it give (a wide_table)."""

    rows = []
    for c in cases:
        result = diagnose(str(c.draft) if c.draft else None, c.target, c.launches)
        bad = [f for f in result["findings"] if f.severity in ("error", "warning")]
        hit = next((f for f in bad if f.check == c.check and f.severity == c.severity), None)
        rows.append(
            {
                "case": c.name,
                "broken": c.story,
                "expected": f"{c.check}/{c.severity}" if c.check else "clean",
                "flagged": bool(hit) if c.check else not bad,
                "all findings": ", ".join(f"{f.check}/{f.severity}" for f in bad) or "none",
                "fix": (hit.fix if hit else ""),
            }
        )
    return wide_table(rows)  # the fix column holds whole corrected commands: shown whole, wrapped
