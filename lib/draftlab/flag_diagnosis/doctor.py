"""`draftlab doctor`: catch the silent draft/target/flag mismatches before a day of serving does.

The bug this exists for: `--speculative-algorithm EAGLE` instead of `EAGLE3`. The target then
sends its final hidden state (H wide) instead of three captured layers (3H), SGLang bypasses the
draft's fc because the width already equals H, and acceptance length sits at 1.0 with no error.

Static mode reads configs and safetensors headers (doctor_checks); `--probe URL` asks a running
server (doctor_probe). `mode_widths` is the dimension story: what each mode sends the draft.
"""

from __future__ import annotations

import functools
from pathlib import Path

from draftlab.flag_diagnosis.checks_server import run_checks
from draftlab.flag_diagnosis.inputs import (
    DoctorInputError,
    Finding,
    load_target_info,
    read_draft,
    read_json,
)
from draftlab.flag_diagnosis.launch_config import with_config
from draftlab.model.capture import default_capture
from draftlab.model.target import text_config
from draftlab.sglang.launch import from_server_info, parse_launch

__all__ = ["diagnose", "mode_widths", "format_findings", "format_probe", "findings_table", "wide_table", "Finding"]


def diagnose(draft: str | None = None, target: str | None = None, launches=(), server_infos=(), servers=()) -> dict:
    """Run every static check the inputs allow. Raises DoctorInputError/LaunchError on unreadable input.

    launches: SGLang command strings; server_infos: saved /server_info files; servers: ready
    ServerSettings (e.g. from a probe). Returns {"draft", "target", "findings": [Finding], "errors", "warnings"}.
    """
    servers = list(servers) + [with_config(parse_launch(cmd)) for cmd in launches]
    for path in server_infos:
        servers.append(from_server_info(read_json(path), source=f"server_info {path}"))
    if target is None:  # the served model, when a launch command or server_info names it
        target = next((s.model_path for s in servers if s.model_path), None)
        if draft is not None and target is None:
            raise DoctorInputError(
                "--target", "needed with --draft (a model folder, config.json, embedded, tiny or a Hub id)"
            )
    draft_files = read_draft(draft) if draft else None
    target_info = None
    if target and (draft_files is not None or readable_here(str(target))):
        target_info = load_target_info(target)  # config only: the widths in the findings are the target's
    findings = run_checks(draft_files, target_info, servers)
    return {
        "draft": str(draft) if draft else None,
        "target": str(target) if target else None,
        "target_shape": _shape(target_info) if target_info else None,
        "servers": [s.source for s in servers],
        "findings": findings,
        "errors": sum(f.severity == "error" for f in findings),
        "warnings": sum(f.severity == "warning" for f in findings),
        "_draft_files": draft_files,
        "_target_info": target_info,
    }


def readable_here(spec: str) -> bool:
    """A target whose config this machine has (no download): embedded, tiny, a folder or config.json."""
    path = Path(spec).expanduser()
    return spec in ("embedded", "tiny") or (path / "config.json").is_file() or path.name == "config.json"


def _shape(t) -> dict:
    return {
        "hidden_size": t.hidden_size,
        "num_layers": t.num_layers,
        "vocab_size": t.vocab_size,
        "model_type": t.model_type,
        "default_capture": t.default_capture,
    }


def mode_widths(target_config: dict, capture_layers=None) -> list:
    """What each --speculative-algorithm delivers to an EAGLE-3 draft of this target (from its config).

    capture_layers: the hidden_states indices captured in EAGLE3 mode (default SGLang's [2, N//2, N-3]).
    SGLang runs the draft's fc only when the incoming width differs from H.
    """
    cfg = text_config(target_config)
    h, n = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
    layers = list(capture_layers) if capture_layers is not None else default_capture(n)
    rows = []
    for mode, sent, width in (
        ("EAGLE3", f"hidden_states{layers} concatenated", len(layers) * h),
        ("EAGLE", "final hidden state only", h),
    ):
        fc_runs = width != h
        rows.append(
            {
                "mode": mode,
                "target sends": sent,
                "width": width,
                "fc.weight": f"[{h}, {3 * h}]",
                "fc applied": fc_runs,
                "draft input": f"fc: {width} -> {h}" if fc_runs else f"{width} as is (fc bypassed)",
                "head": "draft lm_head + d2t" if mode == "EAGLE3" else "target lm_head (draft's replaced)",
            }
        )
    return rows


def findings_table(findings, hide_ok: bool = False):
    """Findings as a pandas DataFrame (for notebooks) that shows every cell whole (wide_table)."""
    rows = [f.to_dict() for f in findings if not (hide_ok and f.severity == "ok")]
    return wide_table(rows, columns=["check", "severity", "what", "why", "fix", "where"])


@functools.cache
def _wide_frame():
    """The DataFrame subclass behind wide_table, built on first use so `draftlab doctor` starts without pandas."""
    import pandas as pd

    class WideFrame(pd.DataFrame):
        """A DataFrame displayed without cutting cells: wrapped in HTML, whole in plain text."""

        @property
        def _constructor(self):
            return WideFrame

        def __repr__(self) -> str:
            with pd.option_context("display.max_colwidth", None, "display.max_columns", None, "display.width", None):
                return super().__repr__()

        def _repr_html_(self) -> str:
            styled = self.style.set_properties(
                **{"white-space": "pre-wrap", "word-break": "break-word", "text-align": "left", "vertical-align": "top"}
            )
            return styled.to_html()

    return WideFrame


def wide_table(rows, columns=None):
    """A table for notebooks whose long cells (a corrected launch line in `fix`, a `why`) are shown whole.

    pandas cuts every cell at display.max_colwidth (50 characters) with "...", which drops exactly
    the part of a fix a user has to copy. This frame wraps such cells in the notebook's HTML and
    prints them whole as text; it is an ordinary DataFrame otherwise.
    """
    return _wide_frame()(rows, columns=columns)


_LABEL = {"error": "ERROR  ", "warning": "WARNING", "info": "info   ", "ok": "ok     "}


def format_findings(findings, verbose: bool = True) -> str:
    lines = []
    for f in findings:
        if f.severity == "ok" and not verbose:
            continue
        lines.append(f"{_LABEL[f.severity]} {f.check:<26} {f.what}")
        if f.severity != "ok":
            if f.why:
                lines.append(f"{'':35}why: {f.why}")
            if f.fix:
                lines.append(f"{'':35}fix: {f.fix}")
    return "\n".join(lines)


def format_probe(report) -> str:
    lines = [f"probe {report.url}"]
    s = report.settings
    if s is not None:
        lines.append(
            f"  server_info ({report.server_info_endpoint}): algorithm {s.speculative_algorithm or 'none'}, "
            f"draft {s.draft_model_path}, steps {s.num_steps}, topk {s.eagle_topk}, draft tokens "
            f"{s.num_draft_tokens}, "
            f"max running requests {s.max_running_requests}"
        )
    else:
        lines.append("  server_info: not available")
    acc = report.acceptance_length
    lines.append(
        f"  requests via {report.endpoint}: "
        + (
            f"acceptance length {acc:.3f} ({report.acceptance_note})"
            if acc is not None
            else f"acceptance length {report.acceptance_note}"
        )
    )
    if report.lifetime_accept_length is not None:
        lines.append(f"  server lifetime avg_spec_accept_length {report.lifetime_accept_length:.3f}")
    for err in report.errors:
        lines.append(f"  note: {err}")
    if report.causes:
        lines.append("  likely causes, most likely first:" if report.collapsed or acc is None else "  remarks:")
        for i, c in enumerate(report.causes, 1):
            lines.append(f"  {i}. [{c.score:.2f}] {c.cause}\n       evidence: {c.evidence}\n       fix: {c.fix}")
    return "\n".join(lines)
