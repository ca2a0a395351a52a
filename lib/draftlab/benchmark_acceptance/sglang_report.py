"""A run's SGLang figures for summary.json: read from what `draftlab bench sglang`, the engine's
oracle runs and notebook 03 wrote, each with its source; a figure not measured stays None.
`write_summary` puts them in RUN/sglang/summary.json, which run.summary merges.

    python -m draftlab.benchmark_acceptance.sglang_report gaps RUN SAMPLES OUT
        every setting's engine-vs-SGLang gap (oracle_gaps) into OUT, one line each on stdout

Layout of RUN/sglang/: `study/` (draftlab.sglang.live), `oracle_*.json` (`draftlab bench specdec`
rows on the same prompt ids), `version.txt` (the installed SGLang).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from draftlab.benchmark_acceptance.sglang_live import summarize
from draftlab.core.run_folder import RunFolder

KEYS = (
    "sglang_version",
    "sglang_baseline_tok_s_batch1",
    "sglang_acceptance_s6_heldout",
    "sglang_speedup_batch1",
    "sglang_speedup_c16",
    "sglang_wrong_flag_acceptance",
    "engine_vs_sglang_acceptance_gap",
    "sglang_regeneration_tok_s",
)
GOALS = [  # (key, comparison, goal, wording)
    ("sglang_speedup_batch1", ">=", 2.0, "SGLang batch-1 speedup over its own no-speculation baseline"),
    ("engine_vs_sglang_acceptance_gap", "<=", 0.02, "largest engine-vs-SGLang acceptance gap, same prompts"),
    ("sglang_wrong_flag_acceptance", "<=", 1.1, "the EAGLE-3 draft under --speculative-algorithm EAGLE in SGLang"),
    ("sglang_regeneration_tok_s", ">=", 40000, "regeneration through SGLang, output tok/s end to end"),
]


def _setting(algorithm, steps, topk, draft_tokens) -> tuple:
    return (str(algorithm), int(steps), int(topk), int(draft_tokens))


def oracle_gaps(run: str | Path) -> list[dict]:
    """Engine vs SGLang acceptance per setting (batch 1, same prompt ids): (engine - sglang) / sglang."""
    run = Path(run)
    study = RunFolder(run).sglang_study
    if not (study / "windows.jsonl").is_file():
        return []
    table = summarize(study)
    sg = {
        _setting(r.algorithm, r.steps, r.topk, r.draft_tokens): r
        for r in table.itertuples()
        if r.concurrency == 1 and r.algorithm and not r.variant and r.acceptance_length == r.acceptance_length
    }
    out = []
    for path in sorted(RunFolder(run).sglang.glob("oracle_*.json")):
        for row in json.loads(path.read_text()):
            key = _setting(row["mode"], row["num_steps"], row["topk"], row["num_draft_tokens"])
            if key in sg and int(sg[key].samples) == int(row["samples"]):  # the same first N prompt ids
                s = sg[key].acceptance_length
                out.append(
                    {
                        "setting": sg[key].label,
                        "engine": row["acceptance_length"],
                        "sglang": s,
                        "gap": (row["acceptance_length"] - s) / s,
                        "engine_samples": row["samples"],
                        "engine_dtype": row.get("dtype"),
                        "source": path.name,
                    }
                )
    return out


def sglang_summary(run: str | Path, metrics: dict | None = None) -> tuple[dict, dict]:
    """(values, sources) for KEYS; None where the run has no such measurement. `metrics`: the run's
    metrics.json (read from RUN when not given) for 03's regeneration figure."""
    run = Path(run)
    if metrics is None and RunFolder(run).metrics.is_file():
        metrics = json.loads(RunFolder(run).metrics.read_text())
    s, src = {k: None for k in KEYS}, {}
    version = RunFolder(run).sglang / "version.txt"
    if version.is_file():
        s["sglang_version"], src["sglang_version"] = (
            version.read_text().strip(),
            "sglang/version.txt (import on the GPU)",
        )
    study = RunFolder(run).sglang_study
    if (study / "windows.jsonl").is_file():
        t = summarize(study)
        batch1_prompts = int(t[t.concurrency == 1]["samples"].max())
        where = f"sglang/study/summary ({batch1_prompts} prompts at batch 1)"
        base1 = t[(t.label == "baseline") & (t.concurrency == 1)]
        if len(base1):
            s["sglang_baseline_tok_s_batch1"] = float(base1.tokens_per_s_median.iloc[0])
            src["sglang_baseline_tok_s_batch1"] = (
                f"{where}: baseline, concurrency 1, median of {int(base1.windows.iloc[0])} windows"
            )
        s6 = t[(t.label == "EAGLE3 S6 K1 D7") & (t.concurrency == 1)]
        if len(s6):
            s["sglang_acceptance_s6_heldout"] = float(s6.acceptance_length.iloc[0])
            src["sglang_acceptance_s6_heldout"] = f"{where}: EAGLE3 S6 K1 D7, concurrency 1, meta_info"
        for key, conc in (("sglang_speedup_batch1", 1), ("sglang_speedup_c16", 16)):
            rows = t[(t.concurrency == conc) & (t.algorithm == "EAGLE3") & (t.variant == "") & t.speedup_median.notna()]
            if len(rows):
                best = rows.loc[rows.speedup_median.idxmax()]
                s[key] = float(best.speedup_median)
                src[key] = (
                    f"{where}: best EAGLE3 setting at concurrency {conc}, {best.label}, ratio of median "
                    f"tok/s (of means: {best.speedup:.3f} ± {best.speedup_ci95:.3f}); {best.identical}/"
                    f"{batch1_prompts} batch-1 outputs identical to SGLang's baseline"
                )
        wrong = t[(t.algorithm == "EAGLE") & (t.concurrency == 1)]
        if len(wrong):
            s["sglang_wrong_flag_acceptance"] = float(wrong.acceptance_length.iloc[0])
            src["sglang_wrong_flag_acceptance"] = f"{where}: {wrong.label.iloc[0]}, concurrency 1"
    gaps = oracle_gaps(run)
    if gaps:
        worst = max(gaps, key=lambda g: abs(g["gap"]))
        s["engine_vs_sglang_acceptance_gap"] = abs(worst["gap"])
        src["engine_vs_sglang_acceptance_gap"] = (
            f"largest of {len(gaps)} settings: {worst['setting']} engine "
            f"{worst['engine']:.3f} vs SGLang {worst['sglang']:.3f} "
            f"({worst['source']})"
        )
    m03 = (metrics or {}).get("03_regenerate") or {}
    train = (m03.get("splits") or {}).get("train") or {}
    if train.get("tok_s") is not None and m03.get("backend") == "server":
        s["sglang_regeneration_tok_s"] = train["tok_s"]
        src["sglang_regeneration_tok_s"] = (
            f"03 splits.train.tok_s through an SGLang server ({train.get('rows_done')} rows, "
            f"{train.get('completion_tokens')} tokens in {train.get('wall_s')} s)"
        )
    return s, src


def _ratio(a: pd.DataFrame, b: pd.DataFrame, column: str) -> float | None:
    """a's first value of `column` over b's; None where either is missing."""
    if column not in a or column not in b or pd.isna(a[column].iloc[0]) or pd.isna(b[column].iloc[0]):
        return None
    return float(a[column].iloc[0] / b[column].iloc[0])


def variant_table(table: pd.DataFrame, steps: int) -> pd.DataFrame:
    """Batch 1 per server-flag variant (bench sglang --variant) beside the study's own flags ("default"):
    the variant's baseline and chain S = `steps` tok/s (medians), acceptance, the speedup over its own
    baseline, and both over the default baseline: whether the flags speed the server, the draft, or both."""
    t = table[table.concurrency == 1]
    lines = []
    for variant in dict.fromkeys(t.variant):
        own = t[t.variant == variant]
        base = own[own.algorithm.isna()]
        spec = own[(own.algorithm == "EAGLE3") & (own.steps == steps) & (own.topk == 1)]
        if not (len(base) and len(spec)):
            continue
        lines.append(
            {
                "variant": variant or "default",
                "baseline_tok_s": float(base.tokens_per_s_median.iloc[0]),
                "spec_tok_s": float(spec.tokens_per_s_median.iloc[0]),
                "acceptance": float(spec.acceptance_length.iloc[0]),
                "windows": int(spec.windows.iloc[0]),
                # the same over the servers' own seconds (None for windows from before they were recorded)
                "server_speedup": _ratio(spec, base, "server_tokens_per_s_median"),
            }
        )
    df = pd.DataFrame(lines)
    if df.empty or "default" not in set(df.variant):
        return df
    default_base = float(df.loc[df.variant == "default", "baseline_tok_s"].iloc[0])
    df["speedup"] = df.spec_tok_s / df.baseline_tok_s
    df["speedup_vs_default_baseline"] = df.spec_tok_s / default_base
    df["baseline_vs_default_baseline"] = df.baseline_tok_s / default_base
    return df


def write_summary(run: str | Path) -> Path:
    """RUN/sglang/summary.json: values, sources and goals, for run.summary to merge (it reads the
    file, so the run layer never imports this stage)."""
    values, sources = sglang_summary(run)
    path = RunFolder(run).sglang_summary
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"values": values, "sources": sources, "goals": GOALS}, indent=1))
    return path


def write_gaps(run: str | Path, samples: int, out: str | Path) -> list[dict]:
    """oracle_gaps(run) into `out` with the number of prompts, each setting printed on one line."""
    gaps = oracle_gaps(run)
    note = "the engine, then SGLang, on the same prompt ids: acceptance per setting"
    Path(out).write_text(json.dumps({"samples": int(samples), "note": note, "gaps": gaps}, indent=1))
    for g in gaps:
        print(
            g["setting"],
            "engine",
            round(g["engine"], 4),
            "sglang",
            round(g["sglang"], 4),
            f"gap {100 * g['gap']:+.2f}%",
        )
    return gaps


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[0] == "gaps":
        write_gaps(argv[1], int(argv[2]), argv[3])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
