"""Figures for notebook 04: loss and accuracy curves read back from a run's logs."""

from __future__ import annotations

from pathlib import Path


# ---- figures for notebook 04 -----------------------------------------------------------------
def read_logs(train_dir) -> tuple:
    """(train.csv, eval.csv) of a training folder as pandas DataFrames (eval may be empty)."""
    import pandas as pd

    d = Path(train_dir)
    tr = pd.read_csv(d / "train.csv")
    ev = pd.read_csv(d / "eval.csv") if (d / "eval.csv").is_file() else pd.DataFrame()
    return tr, ev


def plot_training(train_dirs: dict):
    """Loss (train) and validation acc_0 / simulated acceptance length per arch, one figure."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for arch, d in train_dirs.items():
        tr, ev = read_logs(d)
        axes[0].plot(tr["step"], tr["loss"], label=arch)
        if len(ev):
            axes[1].plot(ev["step"], ev["acc_0"], marker="o", label=arch)
            axes[2].plot(ev["step"], ev["sim_accept_len"], marker="o", label=arch)
    axes[0].set(title="training loss (TTT-weighted soft CE)", xlabel="step")
    axes[1].set(title="validation acc_0 (first draft token)", xlabel="step")
    axes[2].set(title="simulated acceptance length (val)", xlabel="step")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return fig


def plot_step_accuracy(evals: dict):
    """Final validation accuracy per TTT step i for each arch (bars)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.8 / max(1, len(evals))
    for k, (arch, ev) in enumerate(evals.items()):
        steps = sorted(int(c.split("_")[1]) for c in ev if c.startswith("acc_"))
        offset = (k - (len(evals) - 1) / 2) * width
        ax.bar([s + offset for s in steps], [ev[f"acc_{s}"] for s in steps], width, label=arch)
        ax.set_xticks(steps)
    ax.set(
        title="validation accuracy per draft step (teacher-forced tokens, own hidden states)",
        xlabel="draft step i",
        ylabel="acc_i",
    )
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig
