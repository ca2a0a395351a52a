"""Finish a reference run folder: merged params.yaml, summary.json (the headline keys) and README.md.

Usage: python3 -m draftlab.run.summary RUN_DIR   (pack.sh runs it on the GPU machine; it also runs here)

Every number comes from RUN_DIR/metrics.json as the notebooks wrote it; a key whose measurement is
missing is null and named on stderr, never filled in. `sources` in summary.json says which
notebook and row each figure was read from.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from draftlab.core.run_folder import RunFolder

KEYS = (
    "samples",
    "eagle3_acceptance_s6_heldout",
    "eagle1_acceptance_s6_heldout",
    "eagle3_acceptance_s6_humaneval",
    "eagle3_wrong_flag_acceptance",
    "speedup_batch1",
    "regeneration_tok_s",
    "train_minutes",
)
GOALS = [  # (summary key, comparison, goal, its wording)
    ("eagle3_acceptance_s6_heldout", ">=", 4.0, "EAGLE-3 chain acceptance length on held-out prompts at S = 6"),
    ("eagle3_over_eagle1", ">=", 1.3, "EAGLE-3 / EAGLE-1-style acceptance length, same data"),
    ("eagle3_wrong_flag_acceptance", "<=", 1.1, "the EAGLE-3 draft in EAGLE mode"),
    ("speedup_batch1", ">=", 2.0, "reference-engine speedup at batch 1, lossless"),
]
HEADLINE_FIGURES = [
    ("Acceptance length vs training data (07)", "07_data_scaling_acceptance_vs_data.png"),
    ("Real chain acceptance vs training data (07)", "07_data_scaling_chain_acceptance_vs_data.png"),
    ("EAGLE vs EAGLE3: the same draft under both flags (05)", "05_flag_diagnosis_acceptance_by_mode.png"),
    ("Speedup vs acceptance with the break-even curve (06)", "06_benchmark_acceptance_breakeven.png"),
    ("Acceptance by chain length, with prompt lookup's (06)", "06_benchmark_acceptance_acceptance_by_chain.png"),
    ("Batch-1 speedup by chain length in fp32 and bf16 (06)", "06_benchmark_acceptance_speedup_by_chain_dtypes.png"),
]


def merge_params(run: Path) -> None:
    """The runner rewrites params.yaml per call; merge every call's record (params.d/) into one."""
    parts = sorted((run / "params.d").glob("*.yaml")) if (run / "params.d").is_dir() else []
    if not parts:
        return
    merged = None
    for p in parts:
        rec = yaml.safe_load(p.read_text())
        if merged is None:
            merged = dict(rec)
            merged["notebooks"] = {}
            merged["calls"] = []
        merged["notebooks"].update(rec.get("notebooks", {}))
        merged["calls"].append({"file": p.name, "overrides": rec.get("overrides", {})})
    merged.pop("overrides", None)
    RunFolder(run).params.write_text(yaml.safe_dump(merged, sort_keys=False))
    seconds = {}
    for p in sorted((run / "params.d").glob("*.seconds.json")):
        seconds.update(json.loads(p.read_text()))
    if seconds:
        m = json.loads(RunFolder(run).metrics.read_text())
        m["_run"] = {
            "notebook_seconds": seconds,
            "total_seconds": round(sum(seconds.values()), 1),
            "note": "wall seconds of every device call each notebook took, calls cut by a deadline included",
        }
        RunFolder(run).metrics.write_text(json.dumps(m, indent=2, sort_keys=True))


def _rows(section, *names):
    out = []
    for n in names:
        out += (section or {}).get(n) or []
    return out


def _pick(rows, **want):
    return [r for r in rows if all(r.get(k) == v for k, v in want.items())]


def build_summary(m: dict) -> tuple[dict, dict]:
    s, src = {k: None for k in KEYS}, {}
    m03, m04, m05 = m.get("03_regenerate", {}), m.get("04_train_draft", {}), m.get("05_flag_diagnosis", {})
    m06, m07 = m.get("06_benchmark_acceptance", {}), m.get("07_data_scaling", {})
    e3 = m04.get("eagle3") or {}
    if e3.get("train_stats"):
        s["samples"], src["samples"] = e3["train_stats"]["kept"], "04 eagle3 train_stats.kept"
    if e3.get("elapsed_total_s") is not None:  # summed over the calls a resumed training took
        s["train_minutes"], src["train_minutes"] = (
            round(e3["elapsed_total_s"] / 60, 2),
            "04 eagle3 elapsed_total_s / 60",
        )
    elif e3.get("elapsed_s") is not None:
        s["train_minutes"], src["train_minutes"] = round(e3["elapsed_s"] / 60, 2), "04 eagle3 elapsed_s / 60"
    tok = ((m03.get("splits") or {}).get("train") or {}).get("tok_s")
    if tok is not None:
        s["regeneration_tok_s"], src["regeneration_tok_s"] = tok, "03 splits.train.tok_s"
    first_set = next(iter(m06.get("eval_sets") or {}), None)
    rows06 = _rows(m06, "by_set", "by_chain")
    for arch in ("eagle3", "eagle1"):
        key = f"{arch}_acceptance_s6_heldout"
        hit = _pick(rows06, arch=arch, S=6, K=1, mode="EAGLE3", eval_set=first_set) if first_set != "humaneval" else []
        if hit:
            s[key], src[key] = hit[0]["acceptance_length"], f"06 chain S=6 on {first_set} ({hit[0]['samples']} prompts)"
            continue
        pts = [
            r
            for r in m07.get("results", [])
            if r["arch"] == arch
            and r.get("source") == "04"
            and r.get("chain_acceptance_length") is not None
            and (m07.get("eval") or {}).get("spec_steps") == 6
        ]
        if pts:
            s[key] = pts[0]["chain_acceptance_length"]
            src[key] = f"07 real chain S=6 of 04's draft on {pts[0]['chain_prompts']} held-out val prompts"
    hit = _pick(rows06, arch="eagle3", S=6, K=1, mode="EAGLE3", eval_set="humaneval")
    if hit:
        s["eagle3_acceptance_s6_humaneval"] = hit[0]["acceptance_length"]
        src["eagle3_acceptance_s6_humaneval"] = f"06 chain S=6 on humaneval ({hit[0]['samples']} prompts)"
    wrong = _pick(m06.get("wrong_mode") or [], arch="eagle3")
    if wrong:
        s["eagle3_wrong_flag_acceptance"] = wrong[0]["acceptance_length"]
        src["eagle3_wrong_flag_acceptance"] = f"06 wrong_mode S={wrong[0]['S']} on {wrong[0]['eval_set']}"
    elif (m05.get("acceptance_length") or {}).get("EAGLE") is not None:
        s["eagle3_wrong_flag_acceptance"] = m05["acceptance_length"]["EAGLE"]
        src["eagle3_wrong_flag_acceptance"] = "05 acceptance_length.EAGLE"
    # every engine run of the EAGLE-3 draft on the first set: chains, the tree, and their FAST_DTYPE twins
    runs = _rows(m06, "by_set", "by_chain", "tree", "by_chain_fast_dtype")
    fast = [
        r
        for r in runs
        if str(r.get("arch", "")).startswith("eagle3")
        and r.get("mode") == "EAGLE3"
        and r.get("eval_set") == first_set
        and r.get("speedup") is not None
        and str(r.get("lossless", "")).split("/")[0] == str(r.get("samples"))
    ]
    if fast:
        best = max(fast, key=lambda r: r["speedup"])
        s["speedup_batch1"] = best["speedup"]
        src["speedup_batch1"] = (
            f"06 best lossless eagle3 row on {first_set}: S={best['S']} K={best['K']} "
            f"D={best['D']} ({best['lossless']} identical, {best['dtype']})"
        )
    return s, src


def apply_overrides(run: Path, s: dict, src: dict) -> None:
    """RUN/summary_overrides.json: {key: {"value": v, "source": "how it was measured"}} for a figure that
    metrics.json holds only in part (a stage cut by a device call's deadline and resumed); each
    override must say its derivation, and the README marks it."""
    path = run / "summary_overrides.json"
    if not path.is_file():
        return
    for key, rec in json.loads(path.read_text()).items():
        if key not in KEYS or not isinstance(rec, dict) or "value" not in rec or not rec.get("source"):
            raise SystemExit(f"{path}: entry {key!r} needs a summary key, a 'value' and a 'source'")
        s[key], src[key] = rec["value"], f"override (summary_overrides.json): {rec['source']}"


def goals(s: dict, table=GOALS) -> list[dict]:
    vals = dict(s)
    if s.get("eagle3_acceptance_s6_heldout") and s.get("eagle1_acceptance_s6_heldout"):
        vals["eagle3_over_eagle1"] = s["eagle3_acceptance_s6_heldout"] / s["eagle1_acceptance_s6_heldout"]
    out = []
    for key, op, goal, text in table:
        v = vals.get(key)
        met = None if v is None else (v >= goal if op == ">=" else v <= goal)
        out.append(
            {
                "goal": text,
                "key": key,
                "target": f"{op} {goal}",
                "measured": v,
                "met": met,
                "short_by": None if v is None or met else round(abs(goal - v), 3),
            }
        )
    return out


def readme(run: Path, s: dict, src: dict, g: list[dict], m: dict, keys=KEYS) -> str:
    fmt = lambda v: (
        "not measured"
        if v is None
        # noqa: E731
        else (f"{v:,.3f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v))
    )  # "0.5.17"
    lines = [
        "# Reference run: the embedded target on one H200",
        "",
        "Full profile (`params/full.yaml`), run on one NVIDIA H200; every number "
        "below is read from `metrics.json` (`summary.json` says from which notebook and row), except one "
        "marked override, which comes with its derivation from `summary_overrides.json`.",
        "",
        "| key | value | source |",
        "|---|---|---|",
    ]
    lines += [f"| `{k}` | {fmt(s[k])} | {src.get(k, '')} |" for k in keys]
    if (run / "run_notes.md").is_file():  # what happened in this run that the numbers alone do not say
        lines += ["", (run / "run_notes.md").read_text().strip()]
    lines += ["", "## Goals", "", "| goal | target | measured | met |", "|---|---|---|---|"]
    for r in g:
        met = "not measured" if r["met"] is None else ("yes" if r["met"] else f"no (missed by {r['short_by']})")
        lines.append(f"| {r['goal']} | {r['target']} | {fmt(r['measured'])} | {met} |")
    f07 = (m.get("07_data_scaling") or {}).get("findings") or []
    if f07:
        lines += ["", "## Data scaling (07)", "", "```", *f07, "```"]
    lines += ["", "## Headline plots", ""]
    for title, name in HEADLINE_FIGURES:
        if (RunFolder(run).figures / name).is_file():
            lines += [f"### {title}", "", f"![{title}](figures/{name})", ""]
    lines += ["## Executed notebooks", ""]
    lines += [f"- [{p.stem}](executed/{p.name})" for p in sorted(RunFolder(run).executed.glob("*.ipynb"))]
    secs = (m.get("_run") or {}).get("notebook_seconds") or {}
    if secs:
        lines += ["", "## Wall time per notebook (s, summed over device calls)", ""]
        lines += [f"- {k}: {v:.0f}" for k, v in sorted(secs.items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    run = Path(argv[0])
    if not RunFolder(run).metrics.is_file():
        print(f"{run / 'metrics.json'}: missing; run the notebooks first", file=sys.stderr)
        return 1
    merge_params(run)
    m = json.loads(RunFolder(run).metrics.read_text())
    s, src = build_summary(m)
    apply_overrides(run, s, src)
    g = goals(s)
    keys = KEYS
    sglang = RunFolder(run).sglang_summary  # written by `draftlab bench sglang` (benchmark_acceptance)
    if sglang.is_file():  # a run measured in SGLang: its figures and goals too
        rec = json.loads(sglang.read_text())
        s.update(rec["values"])
        src.update(rec["sources"])
        g += goals(rec["values"], [tuple(goal) for goal in rec["goals"]])
        keys = KEYS + tuple(rec["values"])
    missing = [k for k in keys if s[k] is None]
    if missing:
        print(f"summary: not measured in this run: {missing}", file=sys.stderr)
    (run / "summary.json").write_text(json.dumps({**s, "sources": src, "goals": g}, indent=2))
    (run / "README.md").write_text(readme(run, s, src, g, m, keys))
    print(json.dumps(s, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
