"""Tables and figures of reference-engine runs (notebook 06): rows are `engine.public(compare(...))`
dicts, each naming its evaluation set and sample count.

`python -m draftlab.benchmark_acceptance.report RUN_DIR` redraws a run's speedup-by-chain figure
from its metrics.json into RUN_DIR/figures/readme/ (what README.md shows; `make readme`), with
the rows' sha256 in the PNG, so a test can tell the figure was drawn from those numbers.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from draftlab.core.run_folder import RunFolder
from draftlab.run import notebook as nb
from draftlab.run import settings


def label(row: dict) -> str:
    tree = f" K={row['topk']} D={row['num_draft_tokens']}" if row["topk"] > 1 else ""
    return f"{row.get('arch', 'draft')} {row['mode']} S={row['num_steps']}{tree}"


def table(rows: list[dict]):
    """One line per run: set, samples, configuration, acceptance, tokens/s, speedup, losslessness."""
    import pandas as pd

    out = []
    for r in rows:
        s, g = r["speculative"], r["greedy"]
        out.append(
            {
                "eval_set": r["eval_set"],
                "samples": r["samples"],
                "arch": r.get("arch", ""),
                "mode": r["mode"],
                "S": r["num_steps"],
                "K": r["topk"],
                "D": r["num_draft_tokens"],
                "acceptance_length": r["acceptance_length"],
                "tokens_per_verify": s["mean_accepted_plus_one"],
                "greedy_tok_s": g["tokens_per_s"],
                "spec_tok_s": s["tokens_per_s"],
                "speedup": r["speedup"],
                "decode_speedup": r["decode_speedup"],
                "completion_tokens": s["completion_tokens"],
                "verify_steps": s["verify_steps"],
                "lossless": f"{r['identical_outputs']}/{r['samples']}",
                "device": r["device"],
                "dtype": r["dtype"],
                "cuda_graphs": r.get("cuda_graphs"),
                **({"cuda_graphs_error": r["cuda_graphs_error"]} if r.get("cuda_graphs_error") else {}),
            }
        )
    return pd.DataFrame(out)


def shown(rows, note: str = "skipped", columns: list[str] | None = None):
    """What a notebook cell shows: the table of `rows` (run rows, or a table already), or `note`
    when there is none (a section its parameters skipped)."""
    if rows is None or len(rows) == 0:
        return note
    out = table(rows) if isinstance(rows, list) else rows
    return out[columns] if columns else out


def plot_acceptance_by_set(rows: list[dict]):
    """Grouped bars: acceptance length per evaluation set, one bar per configuration."""
    import matplotlib.pyplot as plt
    import numpy as np

    sets = list(dict.fromkeys(r["eval_set"] for r in rows))
    labels = list(dict.fromkeys(label(r) for r in rows))
    fig, ax = plt.subplots(figsize=(7, 3.8))
    width = 0.8 / max(1, len(labels))
    for j, lab in enumerate(labels):
        vals = []
        for s in sets:
            hit = [r for r in rows if r["eval_set"] == s and label(r) == lab]
            vals.append(hit[0]["acceptance_length"] if hit and hit[0]["acceptance_length"] else np.nan)
        ax.bar(np.arange(len(sets)) + j * width, vals, width, label=lab)
    names = [f"{s}\n(n={next(r['samples'] for r in rows if r['eval_set'] == s)})" for s in sets]
    ax.set_xticks(np.arange(len(sets)) + width * (len(labels) - 1) / 2, names)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_ylabel("acceptance length")
    ax.set_title("acceptance length by evaluation set")
    ax.legend()
    return fig


def plot_acceptance_by_chain(rows: list[dict]):
    """Acceptance length against chain length S, with the S + 1 ceiling."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for key in dict.fromkeys((r["eval_set"], r.get("arch", ""), r["mode"]) for r in rows):
        pts = sorted(
            (r["num_steps"], r["acceptance_length"])
            for r in rows
            if (r["eval_set"], r.get("arch", ""), r["mode"]) == key and r["acceptance_length"]
        )
        n = next(r["samples"] for r in rows if r["eval_set"] == key[0])
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"{key[1]} {key[2]} on {key[0]} (n={n})")
    steps = sorted({r["num_steps"] for r in rows})
    ax.plot(steps, [s + 1 for s in steps], ":", color="grey", label="ceiling S + 1")
    ax.set_xlabel("chain length S (draft steps)")
    ax.set_ylabel("acceptance length")
    ax.set_title("acceptance length by chain length")
    ax.legend()
    return fig


def run_point(row: dict) -> tuple:
    """(S, K, D, speedup, identical outputs, samples) of a run: an engine.public row or a table row
    (metrics.json's `by_chain`, `tree`, `by_chain_fast_dtype`, where lossless reads "k/n")."""
    if "num_steps" in row:
        return (
            row["num_steps"],
            row["topk"],
            row["num_draft_tokens"],
            row["speedup"],
            row["identical_outputs"],
            row["samples"],
        )
    same, _, n = str(row["lossless"]).partition("/")
    return row["S"], row["K"], row["D"], row["speedup"], int(same), int(n or row["samples"])


NOT_LOSSLESS = "not lossless: k/n outputs identical to greedy (no speedup claim)"


def plot_speedup_by_chain(rows: list[dict], note: str = ""):
    """Measured speedup over greedy decoding in the same engine and dtype, against chain length S.

    Chains are lines; each tree (topk K > 1, D verified tokens) is its own marker at its S, never a
    point of a chain's line. A run whose outputs were not all identical to greedy is drawn hollow
    with a red edge and labelled k/n: it is not lossless, so its speed is not a speedup."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.2, 4.2))
    tree_markers = "s^Dv<>p*"
    lossy = False

    def key_of(r):  # a tree's arch may read "eagle3 tree K=4 D=16": it belongs with eagle3's runs
        return r["eval_set"], str(r.get("arch", "")).split(" ")[0], r["dtype"]

    for key in dict.fromkeys(key_of(r) for r in rows):
        group = [r for r in rows if key_of(r) == key]
        points = [run_point(r) for r in group]
        chains = sorted(p for p in points if p[1] == 1)
        (line,) = ax.plot(
            [p[0] for p in chains],
            [p[3] for p in chains],
            "-",
            zorder=2,
            label=f"{key[1]} chain ({key[2]}) on {key[0]} (n={group[0]['samples']})" if chains else None,
        )
        trees = sorted(p for p in points if p[1] > 1)
        marked = [("o", p) for p in chains] + [(tree_markers[i % len(tree_markers)], p) for i, p in enumerate(trees)]
        for marker, (steps, k, d, speedup, same, n) in marked:
            ok = same == n
            lossy |= not ok
            color = line.get_color()
            ax.scatter(
                [steps],
                [speedup],
                marker=marker,
                s=42,
                zorder=3,
                linewidths=1.6,
                facecolors=color if ok else "white",
                edgecolors=color if ok else "tab:red",
            )
            if not ok:
                ax.annotate(
                    f"{same}/{n}",
                    (steps, speedup),
                    textcoords="offset points",
                    xytext=(6, 4),
                    color="tab:red",
                )
            if k > 1:
                ax.scatter(
                    [], [], marker=marker, color=color, label=f"{key[1]} tree K={k} D={d} at S={steps} ({key[2]})"
                )
    if lossy:
        ax.scatter([], [], marker="o", facecolors="white", edgecolors="tab:red", linewidths=1.6, label=NOT_LOSSLESS)
    ax.axhline(1.0, color="grey", ls=":", label="greedy decoding")
    ax.margins(x=0.1)  # room for the k/n labels
    ax.set_xlabel("chain length S (draft steps)")
    ax.set_ylabel("speedup over greedy (same engine, dtype)")
    ax.set_title("batch-1 speedup by chain length" + (f"\n{note}" if note else ""), fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def plot_position_acceptance(rows: list[dict]):
    """Per-position conditional acceptance a_i = P(token i accepted | tokens < i accepted)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for r in rows:
        rates = r["speculative"]["position_acceptance"]
        xs = [i + 1 for i, v in enumerate(rates) if v is not None]
        ax.plot(
            xs, [v for v in rates if v is not None], "o-", label=f"{label(r)} on {r['eval_set']} (n={r['samples']})"
        )
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("draft position i")
    ax.set_ylabel("a_i = P(accepted | all before accepted)")
    ax.set_title("per-position acceptance")
    ax.legend()
    return fig


def plot_throughput(rows: list[dict]):
    """Tokens/s of plain greedy vs speculative decoding in the same engine, per run."""
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(max(7.0, 1.1 * len(rows)), 4.2))  # room for a legible label per run
    names = [f"{label(r)}\n{r['eval_set']}" for r in rows]
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r["greedy"]["tokens_per_s"] for r in rows], 0.4, label="greedy (same engine)")
    ax.bar(x + 0.2, [r["speculative"]["tokens_per_s"] for r in rows], 0.4, label="speculative")
    for i, r in enumerate(rows):
        ax.text(i + 0.2, r["speculative"]["tokens_per_s"], f"{r['speedup']:.2f}x", ha="center", va="bottom")
    ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set_ylabel("tokens/s (batch 1)")
    ax.set_title(f"throughput on {rows[0]['device']} ({rows[0]['dtype']})")
    ax.legend()
    return fig


README_FIGURE = "figures/readme/06_speedup_by_chain.png"


def speedup_rows(metrics06: dict) -> list[dict]:
    """The rows a speedup-by-chain figure draws, from metrics.json's 06 section: every EAGLE-3 run on
    the first evaluation set in DTYPE and FAST_DTYPE, chains and trees."""
    first = next(iter(metrics06.get("eval_sets") or {}), None)
    rows = [r for name in ("by_chain", "tree", "by_chain_fast_dtype") for r in metrics06.get(name) or []]
    return [
        r
        for r in rows
        if r.get("eval_set") == first
        and str(r.get("arch", "")).startswith("eagle3")
        and r.get("mode", "EAGLE3") == "EAGLE3"
        and r.get("speedup") is not None
    ]


def rows_digest(rows: list[dict]) -> str:
    return hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()


def figure_run(run_dir: Path, metrics06: dict):
    """The notebook Run a figure of this run folder's 06 section is stamped and captioned as."""
    have = settings.run_settings(run_dir) or {}
    target, profile = have.get("TARGET", "unknown"), have.get("PROFILE")
    caveat = "; ".join(c for c in (settings.caveat(target), profile and settings.scale_caveat(profile)) if c)
    params = {"TARGET": target, "PROFILE": profile or "unknown"}
    run = nb.Run("06_benchmark_acceptance", run_dir, params, str(metrics06.get("device", "unknown")), caveat or None)
    sets = ", ".join(f"{name} n={n}" for name, n in (metrics06.get("eval_sets") or {}).items())
    run.source = f"draftlab engine ({metrics06.get('dtype')}, {metrics06.get('device')}), {sets}"
    return run


def replot_speedup_by_chain(run_dir: str | Path) -> Path:
    """RUN_DIR/figures/readme/06_speedup_by_chain.png from RUN_DIR/metrics.json (no engine run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    metrics06 = json.loads(RunFolder(run_dir).metrics.read_text())["06_benchmark_acceptance"]
    rows = speedup_rows(metrics06)
    fig = plot_speedup_by_chain(rows, note=f"{run_dir.name}: drawn from metrics.json by `make readme`")
    out = run_dir / README_FIGURE
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = nb.finish_figure(figure_run(run_dir, metrics06), fig)
    fig.savefig(out, dpi=110, bbox_inches="tight", metadata={**meta, "draftlab:rows_sha256": rows_digest(rows)})
    plt.close(fig)
    return out


if __name__ == "__main__":
    for arg in sys.argv[1:] or sys.exit("usage: python -m draftlab.benchmark_acceptance.report RUN_DIR ..."):
        print(replot_speedup_by_chain(arg))
