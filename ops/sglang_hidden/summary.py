"""summary.json of the SGLang hidden-state proof: the issue's figures, each with the file it came from.

    python ops/sglang_hidden/summary.py [--results results/sglang-hidden] [--out DIR/summary.json]

Values are copied from the JSON files the proof steps wrote in the results folder (`proof.py
embedded` -> embedded.json, `proof.py deepseek` -> deepseek_shape.json) and from two files no step
writes yet (drafts.json: the two drafts' acceptances; regeneration_03.json: notebook 03's
`draftlab regenerate` summary through several servers). The only arithmetic is the minimum cosine
over the four slices. `sources` names, for every key, the file and field it was read from, or says
"not measured (...)" and what would measure it: a missing figure is null, never estimated.
Exit 2 with one line when a file is not JSON or a field holds something other than what it names.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SLICES = ("low", "mid", "high", "final")
EMBEDDED = "python ops/sglang_hidden/proof.py embedded (one GPU) writes embedded.json"
DEEPSEEK = "python ops/sglang_hidden/proof.py deepseek (one GPU) writes deepseek_shape.json"
DRAFTS = (
    "two drafts trained on the same conversations and recipe, one from SGLang's captured states "
    "(draftlab train --hidden sglang), one from transformers' (--hidden offline): validation acceptance "
    "from each training summary, SGLang acceptance from draftlab bench sglang on the same prompts, "
    "written as drafts.json with this key; no proof step does it yet"
)
REGEN = (
    "notebook 03 regenerating the training conversations through several SGLang servers of the target; "
    "its draftlab regenerate summary (tok_s, rows_done) saved as regeneration_03.json"
)
DRAFT_KEYS = (
    "val_acceptance_from_sglang",
    "val_acceptance_from_transformers",
    "sglang_acceptance_from_sglang",
    "sglang_acceptance_from_transformers",
)


class SummaryError(Exception):
    """A results file that cannot be read as the proof writes it: one line, exit 2."""


def read_results(folder: Path) -> dict[str, dict]:
    """{file name: its JSON} of the files this summary reads that the folder holds."""
    files = {}
    for name in ("embedded.json", "deepseek_shape.json", "drafts.json", "regeneration_03.json"):
        path = folder / name
        if path.is_file():
            try:
                files[name] = json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                raise SummaryError(f"{path}: not JSON ({exc})") from exc
            if not isinstance(files[name], dict):
                raise SummaryError(f"{path}: a JSON object expected, got {type(files[name]).__name__}")
    return files


def field(files: dict, name: str, path: str, kind: str, missing: str):
    """(value, source) of `path` (dotted) in file `name`; (None, "not measured (missing)") without it."""
    if name not in files:
        return None, f"not measured ({missing})"
    value = files[name]
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            return None, f"not measured ({name} has no {path}; {missing})"
        value = value[key]
    if kind == "number" and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise SummaryError(f"{name}: {path} is {value!r}, not a number")
    if kind == "text" and not isinstance(value, str):
        raise SummaryError(f"{name}: {path} is {value!r}, not text")
    if kind == "object" and not isinstance(value, dict):
        raise SummaryError(f"{name}: {path} is {value!r}, not an object")
    if kind == "ids" and not (isinstance(value, list) and all(type(v) is int for v in value)):
        raise SummaryError(f"{name}: {path} is {value!r}, not a list of layer indices")
    return value, f"{name}: {path}"


def build(folder) -> dict:
    """The summary of `folder`'s proof files: the issue's keys, then `sources` (key -> where from)."""
    files = read_results(Path(folder))
    out, sources = {}, {}

    def put(key: str, value, source: str, into: dict | None = None, prefix: str = "") -> None:
        (out if into is None else into)[key] = value
        sources[prefix + key] = source

    for key in ("sglang_version", "gpu"):
        value, source = field(files, "embedded.json", key, "text", EMBEDDED)
        if value is None:
            value, source = field(files, "deepseek_shape.json", key, "text", EMBEDDED)
        put(key, value, source)
    for key in ("capture_tok_s", "sglang_prefill_tok_s", "capture_vs_prefill"):
        put(key, *field(files, "embedded.json", key, "number", EMBEDDED))

    versus, pre = {}, "capture_vs_transformers."
    for key, block, what in (
        ("max_abs_err", "sglang_vs_transformers_fp32", "max_abs_err"),
        ("baseline_max_abs_err", "transformers_bf16_vs_fp32", "max_abs_err"),
        ("min_cosine", "sglang_vs_transformers_fp32", "min_cosine"),
    ):
        got = [field(files, "embedded.json", f"{block}.{s}.{what}", "number", EMBEDDED) for s in SLICES]
        if any(v is None for v, _ in got):
            put(key, None, next(source for v, source in got if v is None), versus, pre)
            continue
        per_slice = f"embedded.json: {block}.<slice>.{what}, slices {', '.join(SLICES)}"
        if key == "min_cosine":  # one figure: the lowest token cosine of any slice
            put(key, min(v for v, _ in got), "minimum of " + per_slice, versus, pre)
        else:
            put(key, dict(zip(SLICES, (v for v, _ in got))), per_slice, versus, pre)
    put("tolerance", *field(files, "embedded.json", "tolerance", "object", EMBEDDED), versus, pre)
    out["capture_vs_transformers"] = versus

    for key in DRAFT_KEYS:
        put(key, *field(files, "drafts.json", key, "number", DRAFTS))

    shape, pre = {}, "deepseek_shape."
    put("capture_ids", *field(files, "deepseek_shape.json", "capture_ids", "ids", DEEPSEEK), shape, pre)
    put("config_ids", *field(files, "deepseek_shape.json", "config_ids", "ids", DEEPSEEK), shape, pre)
    for key in ("eagle3_width", "eagle_flag_width"):
        put(key, *field(files, "deepseek_shape.json", key, "number", DEEPSEEK), shape, pre)
    out["deepseek_shape"] = shape

    put("regeneration_03_tok_s", *field(files, "regeneration_03.json", "tok_s", "number", REGEN))
    put("regeneration_03_rows", *field(files, "regeneration_03.json", "rows_done", "number", REGEN))
    out["sources"] = sources
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default="results/sglang-hidden", help="the folder of the proof's JSON files")
    ap.add_argument("--out", default="", help="where to write (default RESULTS/summary.json)")
    args = ap.parse_args(argv)
    folder = Path(args.results)
    if not folder.is_dir():
        print(f"summary: error: {folder}: no such folder", file=sys.stderr)
        return 2
    try:
        summary = build(folder)
    except SummaryError as exc:
        print(f"summary: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else folder / "summary.json"
    out.write_text(json.dumps(summary, indent=1) + "\n")
    missing = [k for k, s in summary["sources"].items() if s.startswith("not measured")]
    print(f"{out}: {len(summary['sources']) - len(missing)} figures from files, {len(missing)} not measured")
    return 0


if __name__ == "__main__":
    sys.exit(main())
