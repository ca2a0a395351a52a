"""Tables and figures of reference-engine runs (notebook 06): rows are `engine.public(compare(...))`
dicts, each naming its evaluation set and sample count."""

from __future__ import annotations


def label(row: dict) -> str:
    tree = f" K={row['topk']} D={row['num_draft_tokens']}" if row["topk"] > 1 else ""
    return f"{row.get('arch', 'draft')} {row['mode']} S={row['num_steps']}{tree}"


def table(rows: list[dict]):
    """One line per run: set, samples, configuration, acceptance, tokens/s, speedup, losslessness."""
    import pandas as pd

    out = []
    for r in rows:
        s, g = r["speculative"], r["greedy"]
        out.append({
            "eval_set": r["eval_set"], "samples": r["samples"], "arch": r.get("arch", ""), "mode": r["mode"],
            "S": r["num_steps"], "K": r["topk"], "D": r["num_draft_tokens"],
            "acceptance_length": r["acceptance_length"], "tokens_per_verify": s["mean_accepted_plus_one"],
            "greedy_tok_s": g["tokens_per_s"], "spec_tok_s": s["tokens_per_s"], "speedup": r["speedup"],
            "decode_speedup": r["decode_speedup"], "completion_tokens": s["completion_tokens"],
            "verify_steps": s["verify_steps"], "lossless": f"{r['identical_outputs']}/{r['samples']}",
            "device": r["device"], "dtype": r["dtype"], "cuda_graphs": r.get("cuda_graphs"),
            **({"cuda_graphs_error": r["cuda_graphs_error"]} if r.get("cuda_graphs_error") else {}),
        })
    return pd.DataFrame(out)


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
    ax.legend(fontsize=7)
    return fig


def plot_acceptance_by_chain(rows: list[dict]):
    """Acceptance length against chain length S, with the S + 1 ceiling."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for key in dict.fromkeys((r["eval_set"], r.get("arch", ""), r["mode"]) for r in rows):
        pts = sorted((r["num_steps"], r["acceptance_length"]) for r in rows
                     if (r["eval_set"], r.get("arch", ""), r["mode"]) == key and r["acceptance_length"])
        n = next(r["samples"] for r in rows if r["eval_set"] == key[0])
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"{key[1]} {key[2]} on {key[0]} (n={n})")
    steps = sorted({r["num_steps"] for r in rows})
    ax.plot(steps, [s + 1 for s in steps], ":", color="grey", label="ceiling S + 1")
    ax.set_xlabel("chain length S (draft steps)")
    ax.set_ylabel("acceptance length")
    ax.set_title("acceptance length by chain length")
    ax.legend(fontsize=7)
    return fig


def plot_speedup_by_chain(rows: list[dict]):
    """Measured speedup over greedy decoding in the same engine and dtype, against chain length S."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for key in dict.fromkeys((r["eval_set"], r.get("arch", ""), r["dtype"]) for r in rows):
        pts = sorted(
            (r["num_steps"], r["speedup"]) for r in rows if (r["eval_set"], r.get("arch", ""), r["dtype"]) == key
        )
        n = next(r["samples"] for r in rows if r["eval_set"] == key[0])
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"{key[1]} ({key[2]}) on {key[0]} (n={n})")
    ax.axhline(1.0, color="grey", ls=":", label="greedy decoding")
    ax.set_xlabel("chain length S (draft steps)")
    ax.set_ylabel("speedup over greedy (same engine, dtype)")
    ax.set_title("batch-1 speedup by chain length")
    ax.legend(fontsize=7)
    return fig


def plot_position_acceptance(rows: list[dict]):
    """Per-position conditional acceptance a_i = P(token i accepted | tokens < i accepted)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for r in rows:
        rates = r["speculative"]["position_acceptance"]
        xs = [i + 1 for i, v in enumerate(rates) if v is not None]
        ax.plot(xs, [v for v in rates if v is not None], "o-", label=f"{label(r)} on {r['eval_set']} "
                                                                     f"(n={r['samples']})")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("draft position i")
    ax.set_ylabel("a_i = P(accepted | all before accepted)")
    ax.set_title("per-position acceptance")
    ax.legend(fontsize=7)
    return fig


def plot_throughput(rows: list[dict]):
    """Tokens/s of plain greedy vs speculative decoding in the same engine, per run."""
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 3.8))
    names = [f"{label(r)}\n{r['eval_set']}" for r in rows]
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r["greedy"]["tokens_per_s"] for r in rows], 0.4, label="greedy (same engine)")
    ax.bar(x + 0.2, [r["speculative"]["tokens_per_s"] for r in rows], 0.4, label="speculative")
    for i, r in enumerate(rows):
        ax.text(i + 0.2, r["speculative"]["tokens_per_s"], f"{r['speedup']:.2f}x", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, names, fontsize=6, rotation=30, ha="right")
    ax.set_ylabel("tokens/s (batch 1)")
    ax.set_title(f"throughput on {rows[0]['device']} ({rows[0]['dtype']})")
    ax.legend(fontsize=7)
    return fig
