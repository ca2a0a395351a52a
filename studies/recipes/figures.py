"""The recipe study's figures: one bar pair per row (acceptance in SGLang, held-out and HumanEval) and
acceptance and speedup by chain length. Kept apart from studies.recipes.study, which trains,
measures and tabulates the rows."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def row_labels(df: pd.DataFrame) -> list[str]:
    """The plot's row names; acceptance moves with the batch, so a row read at another concurrency than base
    says which."""
    base_c = set(df.loc[df["row"] == "base", "acceptance_concurrency"])
    return [
        f"{row}\n(batch {c:g})" if base_c and pd.notna(c) and c not in base_c else row
        for row, c in zip(df["row"], df["acceptance_concurrency"])
    ]


def plot(df: pd.DataFrame, path: Path, steps: int = 6, goal: float = 4.0):
    """Acceptance in SGLang per row (held-out and HumanEval bars), the reference recipe's and the goal as lines."""
    import matplotlib.pyplot as plt  # the kernel's inline backend in a notebook, Agg without a display

    fig, ax = plt.subplots(figsize=(1.2 * len(df) + 3, 4))
    x = range(len(df))
    for off, (col, name) in zip(
        (-0.2, 0.2), (("sglang_acceptance_held_out", "held-out"), ("sglang_acceptance_humaneval", "HumanEval"))
    ):
        ax.bar([i + off for i in x], df[col].fillna(0), width=0.4, label=name)
    if "base" in set(df["row"]):
        ax.axhline(
            float(df.loc[df["row"] == "base", "sglang_acceptance_held_out"].iloc[0]),
            color="grey",
            ls="--",
            lw=1,
            label="base, held-out",
        )
    ax.axhline(goal, color="green", ls="-.", lw=1, label=f"goal {goal:g}")
    for i, value in zip(x, df["sglang_acceptance_held_out"]):
        if pd.isna(value):  # trained but never measured in SGLang: say so rather than draw an empty slot
            ax.text(i, 0.1, "not measured\nin SGLang", ha="center", fontsize=8, rotation=90)
    ax.set_xticks(list(x), row_labels(df))
    ax.set_ylim(0, 1.25 * max(goal, float(df["sglang_acceptance_held_out"].max())))  # room for the legend
    ax.set_ylabel(f"acceptance length in SGLang (chain S={steps})")
    ax.set_title(
        "recipe study: one row per recipe\n"
        "(measured in SGLang 0.5.17 on one GPU: H200, or H100 where the results README says)"
    )
    ax.legend(ncol=4, loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_by_steps(by_steps: pd.DataFrame, speed: pd.DataFrame, path: Path):
    """Acceptance in SGLang by chain S, one line per row (held-out solid, HumanEval dashed), and beside it the
    speedup over SGLang's baseline at the study's first concurrency."""
    import matplotlib.pyplot as plt

    fig, (ax, sx) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = {row: f"C{k}" for k, row in enumerate(dict.fromkeys(by_steps["row"]))}
    for row, group in by_steps.dropna().groupby("row", sort=False):
        for name, style in (("held_out", "-"), ("humaneval", "--")):
            line = group[group["set"] == name].sort_values("steps")
            if not line.empty:
                ax.plot(
                    line["steps"],
                    line["acceptance"],
                    style,
                    marker="o",
                    color=colors[row],
                    label=f"{row}, {name.replace('_', '-')}",
                )
    for row, group in speed.dropna().groupby("row", sort=False):
        line = group.sort_values("steps")
        sx.plot(line["steps"], line["speedup"], marker="o", color=colors.get(row, "k"), label=row)
    sx.axhline(1.0, color="grey", ls="--", lw=1)
    for a in (ax, sx):
        a.set_xlabel("chain length S (--speculative-num-steps)")
        a.legend(fontsize=8)
    ax.set_ylabel("acceptance length in SGLang")
    level = int(speed["concurrency"].iloc[0]) if not speed.empty else "?"
    sx.set_ylabel(f"speedup over SGLang's baseline (c={level})")
    fig.suptitle("recipe study by chain length (SGLang 0.5.17, one H200 or H100)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
