"""Checks of the SGLang launch flags against the draft (docs/eagle3-contract.md 4), and run_checks."""

from __future__ import annotations

from pathlib import Path

from draftlab.flag_diagnosis.checks import (
    check_architecture,
    check_capture_layers,
    check_fc_norm,
    check_fc_width,
    check_hidden_size,
    check_tensor_names,
)
from draftlab.flag_diagnosis.checks_config import check_rope, check_tie_embeddings
from draftlab.flag_diagnosis.checks_paths import check_paths
from draftlab.flag_diagnosis.checks_vocab import check_d2t_mapping, check_vocab
from draftlab.flag_diagnosis.inputs import (
    DoctorInputError,
    DraftFiles,
    Finding,
    TargetInfo,
    _config_fix,
    read_draft,
)
from draftlab.model.capture import capture_layers_from_config
from draftlab.sglang.launch import set_flag


def check_context_length(d: DraftFiles, t: TargetInfo, servers: list) -> list:
    where = str(d.config_path)
    mpe = d.config.get("max_position_embeddings")
    contexts = [(s, s.context_length) for s in servers if s.is_speculative and s.context_length]
    if not contexts:
        contexts = [(None, t.max_position_embeddings)] if t.max_position_embeddings else []
    out = []
    for server, ctx in contexts:
        source = (
            f"--context-length {ctx} of {server.source[:60]}"
            if server
            else f"the target's max_position_embeddings ({ctx}, SGLang's default context)"
        )
        if mpe is None:
            out.append(
                Finding(
                    "context_length",
                    "warning",
                    "max_position_embeddings is missing from config.json",
                    "SGLang compares it with the server's context length at start-up",
                    _config_fix("max_position_embeddings", int(ctx)),
                    where,
                )
            )
        elif int(mpe) < int(ctx):
            allowed = server is not None and server.env.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN") == "1"
            fix = _config_fix("max_position_embeddings", int(ctx))
            if server is not None and server.command:
                fix += f", or serve a shorter context: {set_flag(server.command, '--context-length', int(mpe))}"
            out.append(
                Finding(
                    "context_length",
                    "warning" if allowed else "error",
                    f"draft max_position_embeddings {mpe} < context length {ctx} ({source})",
                    "SGLang refuses to start unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"
                    + (" (set here: the draft will see positions it was never configured for)" if allowed else ""),
                    fix,
                    where,
                )
            )
        else:
            out.append(
                Finding("context_length", "ok", f"max_position_embeddings {mpe} >= context length {ctx}", where=where)
            )
    return out


def flag_fix(s, flag: str, value) -> str:
    """The minimal fix (the one flag and its value) first, then the whole corrected line."""
    where = getattr(s, "config_file", None)
    first = f"set {flag} {value}" + (f" (on the line, which wins over {where}, or in {where})" if where else "")
    if not s.command:
        return f"restart the server: {first}"
    return f"{first}; the whole line: {set_flag(s.command, flag, value)}"


def eagle_widths(d: DraftFiles | None, t: TargetInfo | None) -> str:
    """The flag bug in the user's numbers: what fc takes and what EAGLE sends, e.g. 1728 = 3 x 576 against 576."""
    h = t.hidden_size if t is not None else (d.config.get("hidden_size") if d is not None else None)
    fc = d.tensors.get("fc.weight", ((),))[0] if d is not None else ()
    if not isinstance(h, int):
        return "the target sends its final hidden state (width H) instead of three captured layers (3 x H)"
    if len(fc) == 2:
        n = fc[1]
        taken = f"{n} = 3 x {n // 3}" if n % 3 == 0 else str(n)
        whose = "the draft's fc takes " + taken
    else:
        whose = f"an EAGLE-3 draft of this target takes {3 * h} = 3 x {h}"
    ids = capture_layers_from_config(d.config) if d is not None else None
    ids = ids or (t.default_capture if t is not None else None)
    return f"{whose}{f' (hidden_states {ids})' if ids else ''}; under EAGLE the target sends {h}"


def check_algorithm(d: DraftFiles | None, servers: list, t: TargetInfo | None = None) -> list:
    out = []
    for s in servers:
        if not s.is_speculative and s.draft_model_path:
            # SGLang ignores the draft path without an algorithm: the server runs, plainly, and a
            # benchmark against it measures no speculation at all.
            eagle1 = d is not None and not d.uses_aux
            want = "EAGLE" if eagle1 else "EAGLE3"
            out.append(
                Finding(
                    "algorithm",
                    "error",
                    f"--speculative-draft-model-path {s.draft_model_path} without --speculative-algorithm",
                    "without an algorithm SGLang does not load the draft and decodes without speculation, "
                    "with no error",
                    flag_fix(s, "--speculative-algorithm", want),
                    s.source,
                )
            )
        if not s.is_speculative:
            continue
        algo = s.speculative_algorithm
        served, assumed = d, ""
        if served is None and s.draft_model_path and (Path(s.draft_model_path) / "config.json").is_file():
            try:
                served = read_draft(s.draft_model_path)
            except DoctorInputError:
                served = None
        if served is None:
            assumed = " (draft folder not readable here: assuming an EAGLE-3 draft)"
        eagle3_draft = served is None or served.uses_aux
        if eagle3_draft and algo != "EAGLE3":
            out.append(
                Finding(
                    "algorithm",
                    "error",
                    f"an EAGLE-3 draft served with --speculative-algorithm {algo}{assumed}: {eagle_widths(served, t)}",
                    "only EAGLE3 makes the target capture the three aux layers; with EAGLE it sends its final "
                    "hidden state, whose width equals the draft's hidden size, so SGLang bypasses fc, replaces the "
                    "draft's lm_head/d2t by the target's head, and acceptance length sits at ~1.0 with no error",
                    flag_fix(s, "--speculative-algorithm", "EAGLE3"),
                    s.source,
                )
            )
        elif not eagle3_draft and algo == "EAGLE3":
            out.append(
                Finding(
                    "algorithm",
                    "error",
                    "an EAGLE-1-style draft (no fc) served with --speculative-algorithm EAGLE3",
                    "EAGLE3 sends a 3H-wide concatenation the draft has no fc for",
                    flag_fix(s, "--speculative-algorithm", "EAGLE"),
                    s.source,
                )
            )
        elif not eagle3_draft and algo == "EAGLE" and "lm_head.weight" in served.tensors:
            out.append(
                Finding(
                    "algorithm",
                    "warning",
                    "an EAGLE-1-style draft with its own lm_head served with --speculative-algorithm EAGLE",
                    "in EAGLE mode SGLang replaces the draft's lm_head and d2t with the target's head, so the "
                    "head this draft was trained with is not used (draftlab's EAGLE-1-style draft is an ablation for "
                    "the reference engine)",
                    "measure it with draftlab.engine, or train and serve an EAGLE-3 draft with --speculative-algorithm "
                    "EAGLE3",
                    s.source,
                )
            )
        else:
            out.append(Finding("algorithm", "ok", f"--speculative-algorithm {algo} fits the draft", where=s.source))
        if algo in ("EAGLE", "EAGLE3") and not s.draft_model_path and s.command:
            out.append(
                Finding(
                    "algorithm",
                    "error",
                    f"--speculative-algorithm {algo} without --speculative-draft-model-path",
                    "SGLang needs the draft folder for EAGLE-family algorithms",
                    flag_fix(s, "--speculative-draft-model-path", str(d.folder) if d else "DRAFT_DIR"),
                    s.source,
                )
            )
    return out


def check_topk_draft_tokens(servers: list) -> list:
    out = []
    for s in servers:
        if not s.is_speculative or s.eagle_topk != 1 or s.num_steps is None or s.num_draft_tokens is None:
            continue
        want = s.num_steps + 1
        if s.num_draft_tokens != want:
            fix = (
                set_flag(s.command, "--speculative-num-draft-tokens", want)
                if s.command
                else f"--speculative-num-draft-tokens {want}"
            )
            out.append(
                Finding(
                    "topk_draft_tokens",
                    "warning",
                    f"--speculative-eagle-topk 1 with --speculative-num-draft-tokens {s.num_draft_tokens} != "
                    f"steps + 1 = {want}",
                    f"with topk 1 SGLang forces num_draft_tokens = steps + 1 = {want}: the value you give is "
                    "ignored, and anything recorded from the command (benchmark tables) is wrong",
                    fix,
                    s.source,
                )
            )
        else:
            out.append(
                Finding(
                    "topk_draft_tokens",
                    "ok",
                    f"topk 1, {s.num_steps} steps, {s.num_draft_tokens} draft tokens",
                    where=s.source,
                )
            )
    return out


def check_max_running_requests(servers: list) -> list:
    """A baseline and a speculative server must run with the same --max-running-requests."""
    if len(servers) < 2:
        return []
    values = [(s, s.effective_max_running_requests) for s in servers]
    if len({v for _, v in values}) == 1:
        return [
            Finding(
                "max_running_requests",
                "ok",
                f"all {len(servers)} servers run with --max-running-requests {values[0][1]}",
                where="; ".join(s.source[:40] for s in servers),
            )
        ]
    explicit = [s.max_running_requests for s in servers if s.max_running_requests is not None]
    value = min(explicit) if explicit else 48
    described = ", ".join(
        f"{'speculative' if s.is_speculative else 'baseline'} {v if v is not None else 'auto (sized from memory)'}"
        + ("" if s.max_running_requests is not None else (" (EAGLE default)" if v is not None else ""))
        for s, v in values
    )
    fixes = [set_flag(s.command, "--max-running-requests", value) for s in servers if s.command]
    return [
        Finding(
            "max_running_requests",
            "error",
            f"unequal --max-running-requests: {described}",
            "EAGLE-family servers cap running requests at 48 unless told otherwise; a baseline with a larger "
            "batch makes the speed comparison unfair",
            " ; ".join(fixes) if fixes else f"start every server with --max-running-requests {value}",
            "; ".join(s.source[:40] for s in servers),
        )
    ]


def run_checks(draft: DraftFiles | None, target: TargetInfo | None, servers: list) -> list:
    """All static checks that the given inputs allow, in the contract's order."""
    findings = []
    findings += check_algorithm(draft, servers, target)
    findings += check_paths(draft, target, servers)
    if draft is not None:
        for note in draft.notes:
            findings.append(
                Finding(
                    "files",
                    "warning",
                    note,
                    "SGLang loads every safetensors file; the contract ships one",
                    "save one model.safetensors",
                    str(draft.folder),
                )
            )
        findings += check_architecture(draft)
    if draft is not None and target is not None:
        findings += check_hidden_size(draft, target)
        findings += check_fc_width(draft, target)
        findings += check_fc_norm(draft)
        findings += check_capture_layers(draft, target)
        findings += check_vocab(draft, target)
        findings += check_d2t_mapping(draft, target)
        findings += check_context_length(draft, target, servers)
        findings += check_rope(draft, target)
        findings += check_tensor_names(draft, target)
    if draft is not None:
        findings += check_tie_embeddings(draft)
    findings += check_topk_draft_tokens(servers)
    findings += check_max_running_requests(servers)
    return findings
