"""The evaluation suite: several kinds of prompts, each decontaminated against training, reported per set.

Why: a draft trained and measured on one source reads well on it and worse on the traffic it will
serve. The suite measures it per kind (code, chat, multi-turn, math, instruction following,
summarisation, the user's own traffic; data/catalog.yaml `eval_sets`), and the mean over the general
sets (every set but the docstring-derived held-out split).

Names, as `--eval-set` takes them: `suite` (DEFAULT_SUITE), `suite:NAME,NAME,...` where a NAME is a
catalog set, `blend` (RUN_DIR/data/blend/test.jsonl) or `traffic=PATH`; and `traffic:PATH` alone.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from draftlab.core.acceptance import acceptance_length
from draftlab.core.errors import InputError
from draftlab.core.overlap import EvalIndex
from draftlab.core.progress import tqdm
from draftlab.core.records import prompt_messages, read_jsonl
from draftlab.core.run_folder import RunFolder
from draftlab.dataset_discovery.eval_sets import eval_catalog, prompt_text, shipped_rows
from draftlab.dataset_discovery.offline import humaneval_problems, humaneval_prompt
from draftlab.dataset_discovery.traffic import traffic_prompts
from draftlab.engine import SpecConfig, compare, encode_prompts, public

DEFAULT_SUITE = ("humaneval", "mt-bench", "mt-bench-2turn", "gsm-symbolic", "ifbench", "verne-summaries")
PER_SET = 80  # prompts per set at most unless a limit is given (HumanEval has 164)


@dataclass
class EvalSet:
    """One set of the suite: its prompts (rows with id, source, messages, set) and what was dropped."""

    name: str
    kind: str
    general: bool
    prompts: list[dict]
    contaminated: list[str] = field(default_factory=list)  # ids dropped as overlapping training


def add_eval_set_options(p, default: str = "humaneval") -> None:
    """`--eval-set`, `--run-dir` and `--train-data`: the prompts a benchmark measures, the same for every
    bench command (a suite is reported per set, decontaminated against the training data given)."""
    p.add_argument(
        "--eval-set",
        default=default,
        help="humaneval | blend (RUN_DIR/data/blend/test.jsonl) | file.jsonl | suite[:NAME,...] (a table per set) "
        "| traffic:REQUESTS.jsonl",
    )
    p.add_argument("--run-dir", default="results/dev", help="where `blend` finds data/blend/test.jsonl")
    p.add_argument(
        "--train-data", action="append", default=[], help="suite: training JSONL the sets are decontaminated against"
    )


def is_suite(name: str) -> bool:
    return name == "suite" or name.startswith(("suite:", "traffic:"))


def suite_names(name: str) -> list[str]:
    """The set names a suite name stands for (see the module docstring)."""
    if name.startswith("traffic:"):
        return [f"traffic={name.split(':', 1)[1]}"]
    if name == "suite":
        return list(DEFAULT_SUITE)
    names = [n.strip() for n in name.split(":", 1)[1].split(",") if n.strip()]
    if not names:
        raise InputError(f"--eval-set {name}: no set named after 'suite:'")
    return names


def _rows(raw: list[dict], set_name: str, where: str, limit: int | None) -> list[dict]:
    out = []
    for i, row in enumerate(raw[:limit] if limit else raw):
        messages = prompt_messages(row, f"{where}: row {i + 1}")
        out.append({"id": row.get("id", f"{set_name}:{i + 1}"), "source": row.get("source", set_name),
                    "messages": messages, "set": set_name})  # fmt: skip
    return out


def load_set(name: str, run_dir: str | Path | None = None, limit: int | None = None, catalog=None) -> EvalSet:
    """One set by name: a catalog set, `humaneval`, `blend` or `traffic=PATH`."""
    catalog = catalog if catalog is not None else eval_catalog()
    if name.startswith("traffic="):
        path = Path(name.split("=", 1)[1])
        rows = traffic_prompts(path, limit)
        label = f"traffic/{path.stem}"
        return EvalSet(label, "traffic", True, _rows(rows, label, str(path), limit))
    if name not in catalog or name == "traffic":
        known = sorted(set(catalog) - {"traffic"})
        raise InputError(f"unknown evaluation set {name!r}; known: {known} and traffic=PATH")
    entry = catalog[name]
    if name == "humaneval":
        raw = [
            {
                "id": p["task_id"],
                "source": "openai/humaneval",
                "messages": [{"role": "user", "content": humaneval_prompt(p)}],
            }
            for p in humaneval_problems()
        ]
    elif name == "blend":
        path = RunFolder(run_dir or "results/dev").split("blend", "test")
        if not path.is_file():
            raise InputError(f"{path}: missing; run notebook 02_blend (the blend's held-out split) first")
        raw = list(read_jsonl(path))
    else:
        raw = shipped_rows(name, catalog)
    return EvalSet(name, entry["kind"], bool(entry["general"]), _rows(raw, name, name, limit))


def load_suite(name: str, run_dir: str | Path | None = None, limit: int | None = None) -> list[EvalSet]:
    """Every set of a suite name, `limit` (default PER_SET) prompts at most from each."""
    catalog, limit = eval_catalog(), limit or PER_SET
    sets = [load_set(n, run_dir, limit, catalog) for n in suite_names(name)]
    names = [s.name for s in sets]
    if len(set(names)) != len(names):
        raise InputError(f"--eval-set {name}: a set is named twice ({names})")
    return sets


# ------------------------------------------------------------------------------- decontamination


def decontaminate(
    sets: list[EvalSet], training: list[str | Path], ngram: int = 13, threshold: float = 0.8, progress=True
) -> dict[str, dict]:
    """Drop from each set the prompts that a training conversation overlaps (a shared word `ngram` over
    all turns, or a near-duplicate of its user turns); returns {set: {n, contaminated}}."""
    owner = {f"{s.name}\x00{p['id']}": s for s in sets for p in s.prompts}
    index = EvalIndex({key: prompt_text(p) for s in sets for p in s.prompts
                       for key in [f"{s.name}\x00{p['id']}"]}, ngram, threshold)  # fmt: skip
    hit: set[str] = set()
    for path in training:
        path = Path(path)
        if not path.is_file():
            raise InputError(f"--decontaminate {path}: {'is a folder' if path.is_dir() else 'does not exist'}")
        for row in tqdm(read_jsonl(path), desc=f"decontaminate vs {path.name}", unit="row", disable=not progress):
            turns = row.get("messages") or []
            text = "\n".join(m.get("content") or "" for m in turns if isinstance(m, dict))
            user = "\n".join(m.get("content") or "" for m in turns if isinstance(m, dict) and m.get("role") == "user")
            hit |= index.hits(text, user)
    report = {}
    for s in sets:
        keys = {k for k in hit if owner[k] is s}
        s.contaminated = sorted(k.split("\x00", 1)[1] for k in keys)
        before = len(s.prompts)
        s.prompts = [p for p in s.prompts if f"{s.name}\x00{p['id']}" not in keys]
        report[s.name] = {"n": len(s.prompts), "contaminated": before - len(s.prompts)}
    return report


def interleave(sets: list[EvalSet]) -> list[dict]:
    """All prompts, one set after another in turn, so that any prefix holds every set in proportion."""
    out, queues = [], [list(s.prompts) for s in sets]
    total = sum(map(len, queues))
    taken = [0] * len(queues)
    while len(out) < total:  # the set furthest behind its share goes next
        i = min((j for j, q in enumerate(queues) if taken[j] < len(q)), key=lambda j: (taken[j] + 1) / len(queues[j]))
        out.append(queues[i][taken[i]])
        taken[i] += 1
    return out


# ---------------------------------------------------------------------------------- the report


def per_set(records: list[dict], sets: list[EvalSet]) -> list[dict]:
    """Per set: kind, n and acceptance (sum of completion tokens / sum of verify steps) from per-request
    records {"set", "completion_tokens", "spec_verify_ct"}; then a `mean (general)` row, the unweighted
    mean over the general sets measured."""
    rows = []
    for s in sets:
        mine = [r for r in records if r["set"] == s.name]
        ok = mine and all(r.get("spec_verify_ct") is not None for r in mine)
        tokens = [r["completion_tokens"] for r in mine]
        acc = acceptance_length(tokens, [r["spec_verify_ct"] for r in mine]) if ok else None
        rows.append({"set": s.name, "kind": s.kind, "general": s.general, "n": len(mine), "acceptance": acc})
    return rows + [mean_general(rows)]


def mean_general(rows: list[dict]) -> dict:
    """The unweighted mean acceptance of the general sets that have one (None when none has)."""
    values = [r["acceptance"] for r in rows if r["general"] and r["acceptance"] is not None]
    return {
        "set": "mean (general)",
        "kind": "",
        "general": True,
        "n": sum(r["n"] for r in rows if r["general"] and r["acceptance"] is not None),
        "acceptance": sum(values) / len(values) if values else None,
    }


def suite_summary(rows: list[dict]) -> dict:
    """One draft's entry of results/eval-suite/summary.json: `sets` (kind, n, acceptance) and `mean_general`."""
    sets = {r["set"]: {"kind": r["kind"], "n": r["n"], "acceptance": r["acceptance"]}
            for r in rows if r["set"] != "mean (general)"}  # fmt: skip
    return {"sets": sets, "mean_general": mean_general([r for r in rows if r["set"] != "mean (general)"])["acceptance"]}


def format_table(rows: list[dict], label: str = "") -> str:
    """The per-set table as text (what the bench commands print)."""
    head = f"{'set':<28} {'kind':<14} {'n':>4} {'acceptance':>10}"
    lines = [f"{label} per set:" if label else "per set:", head]
    for r in rows:
        acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.3f}"
        lines.append(f"{r['set']:<28} {r['kind']:<14} {r['n']:>4} {acc:>10}")
    return "\n".join(lines)


def prepare(
    name: str, run_dir=None, train_data: list[str] | tuple = (), limit: int | None = None, progress: bool = True
) -> tuple[list[EvalSet], dict]:
    """The suite's sets, decontaminated against `train_data` (training JSONL files), and that report;
    without training files each set is marked `contaminated: null` (not checked) and a line says so."""
    sets = load_suite(name, run_dir, limit)
    if train_data:
        report = decontaminate(sets, list(train_data), progress=progress)
    else:
        report = {s.name: {"n": len(s.prompts), "contaminated": None} for s in sets}
        print("eval suite: not decontaminated (give --train-data TRAIN.jsonl, the draft's training file)")
    empty = [s.name for s in sets if not s.prompts]
    if empty:
        raise InputError(f"--eval-set {name}: no prompt left in {empty} after decontamination")
    return sets, report


def plan_fields(sets: list[EvalSet], report: dict) -> dict:
    """What a study's plan.json records of the suite: each set, and the set of every prompt (interleaved)."""
    return {
        "suite": [{"name": s.name, "kind": s.kind, "general": s.general, "n": len(s.prompts),
                   "contaminated": report.get(s.name, {}).get("contaminated")} for s in sets],
        "prompt_sets": [p["set"] for p in interleave(sets)],
    }  # fmt: skip


def report_sglang(out: str | Path) -> Path:
    """Print each server's per-set table of a suite study and write OUT/eval_suite.json (per label:
    suite_summary). Servers without speculation read acceptance None."""
    out = Path(out)
    tables = sglang_per_set(out)
    for label, rows in tables.items():
        print(format_table(rows, label))
    path = out / "eval_suite.json"
    path.write_text(json.dumps({label: suite_summary(rows) for label, rows in tables.items()}, indent=1))
    return path


def sglang_per_set(out: str | Path, sets: list[EvalSet] | None = None) -> dict[str, list[dict]]:
    """{label: per-set rows} of a `bench sglang` study run on a suite: each server's batch-1 replies
    (OUT/outputs/<label>.jsonl, by prompt index) grouped by the set recorded in OUT/plan.json."""
    out = Path(out)
    plan = json.loads((out / "plan.json").read_text())
    sets_by_name = {s["name"]: s for s in plan.get("suite", [])}
    if not sets_by_name:
        raise InputError(f"{out / 'plan.json'}: not a suite study (no 'suite' entry)")
    objs = sets or [EvalSet(n, e["kind"], e["general"], []) for n, e in sets_by_name.items()]
    which = plan["prompt_sets"]
    result = {}
    for path in sorted((out / "outputs").glob("*.jsonl")):
        replies = list(read_jsonl(path, skip_torn_tail=False))
        records = [{"set": which[r["index"]], **r} for r in replies]
        label = next((e["label"] for e in plan["entries"] if _slug(e["label"]) == path.stem), path.stem)
        result[label] = per_set(records, objs)
    return result


def _slug(label: str) -> str:  # sglang_live.slug (not imported: live imports this module)
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_")


def per_set_results(results: list[dict], sets: list[EvalSet]) -> list[dict]:
    """Per-set rows from one pooled result per set ({"eval_set", "samples", "acceptance_length"}: an engine
    run or a live table's row), then the general mean."""
    by = {r["eval_set"]: r for r in results}
    rows = [
        {
            "set": s.name,
            "kind": s.kind,
            "general": s.general,
            "n": int(by[s.name]["samples"]) if s.name in by else 0,
            "acceptance": _number(by.get(s.name, {}).get("acceptance_length")),
        }
        for s in sets
    ]
    return rows + [mean_general(rows)]


def _number(value) -> float | None:
    return None if value is None or value != value else float(value)  # NaN (a pandas gap) is None


# ------------------------------------------------------------------------------ notebook 06


def engine_table(target, draft, sets: list[EvalSet], steps: int, max_new_tokens: int, mode: str = "EAGLE3"):
    """Per-set rows of the reference engine's chain of `steps` (greedy and speculative on each set's prompts)."""
    config = SpecConfig(mode=mode, num_steps=steps, max_new_tokens=max_new_tokens)
    results = [
        public(compare(target, draft, encode_prompts(target, [p["messages"] for p in s.prompts]), config, s.name))
        for s in sets
    ]
    return per_set_results(results, sets)


def plot_per_set(rows: list[dict], title: str):
    """Bars of acceptance per set (the docstring split hatched: not in the mean), the general mean as a line."""
    import matplotlib.pyplot as plt

    sets = [r for r in rows if r["set"] != "mean (general)" and r["acceptance"] is not None]
    mean = rows[-1]["acceptance"]
    fig, ax = plt.subplots(figsize=(1.2 * len(sets) + 3, 4))
    bars = ax.bar([f"{r['set']}\n{r['kind']} n={r['n']}" for r in sets], [r["acceptance"] for r in sets],
                  hatch=["" if r["general"] else "//" for r in sets], color="tab:blue")  # fmt: skip
    ax.bar_label(bars, fmt="%.2f", fontsize=8)
    if mean is not None:
        ax.axhline(mean, color="tab:red", linestyle="--", label=f"mean over general sets {mean:.2f}")
        ax.legend(fontsize=8)
    ax.set_ylabel("acceptance length (tokens per verify step)")
    ax.set_title(title)
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    return fig


def suite_frame(rows: list[dict], report: dict):
    """The per-set table with each set's decontamination count beside it (None: not checked)."""
    import pandas as pd

    frame = pd.DataFrame(rows)
    frame["contaminated"] = pd.Series([report.get(r["set"], {}).get("contaminated") for r in rows], dtype=object)
    return frame


def save_summary(path: str | Path, label: str, rows: list[dict], report: dict) -> Path | None:
    """{label: suite_summary, "decontamination": report} as JSON (nothing without rows)."""
    if not rows:
        return None
    Path(path).write_text(json.dumps({label: suite_summary(rows), "decontamination": report}, indent=1))
    return Path(path)
