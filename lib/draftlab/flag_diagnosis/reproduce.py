"""The runtime half of notebook 05: what each server flag really sends, and what it does to acceptance.

The static checks (flag_diagnosis.doctor) read only files; these run the target and the draft in
the reference engine, so they load torch and live apart from `draftlab doctor`'s start-up path.
"""

from __future__ import annotations

from draftlab.core.records import read_jsonl
from draftlab.core.run_folder import RunFolder
from draftlab.engine import SpecConfig, compare, encode_prompts, public
from draftlab.flag_diagnosis.probe import PROBE_PROMPTS
from draftlab.model.hidden import target_states


def measured_widths(target, capture_layers=None, prompt: str = "Hello! How are you?") -> list:
    """The widths each mode really delivers, measured with one forward pass of the loaded target.

    EAGLE3: the concatenation of hidden_states[capture_layers] [B,T,3H]; EAGLE: the last layer's
    (pre-norm) output [B,T,H]. Whether SGLang applies fc follows from width != H.
    """
    layers = list(capture_layers) if capture_layers is not None else list(target.capture_layers)
    ids = target.tokenizer(
        target.render([{"role": "user", "content": prompt}], add_generation_prompt=True),
        return_tensors="pt",
        add_special_tokens=False,
    )["input_ids"]
    aux, last, _ = target_states(target, ids, layers=layers)  # aux [1,T,3H], last [1,T,H]
    h = target.hidden_size
    rows = []
    for mode, sent, tensor in (
        ("EAGLE3", f"hidden_states{layers} concatenated", aux),
        ("EAGLE", "final hidden state only", last),
    ):
        width = int(tensor.shape[-1])
        rows.append(
            {
                "mode": mode,
                "target sends": sent,
                "measured shape": list(tensor.shape),
                "width": width,
                "fc.weight": f"[{h}, {3 * h}]",
                "fc applied": width != h,
                "head": "draft lm_head + d2t" if mode == "EAGLE3" else "target lm_head (draft's replaced)",
            }
        )
    return rows


def eval_prompts(run_dir, n: int) -> tuple:
    """(name, prompts): the blend's held-out split when notebook 02 ran, else doctor's built-in prompts."""

    test = RunFolder(run_dir).split("blend", "test")
    if test.is_file():
        prompts = []
        for row in read_jsonl(test):
            msgs = row["messages"]
            last_user = max((i for i, m in enumerate(msgs) if m["role"] == "user"), default=None)
            if last_user is not None:
                prompts.append(msgs[: last_user + 1])
            if len(prompts) >= n:
                break
        if prompts:
            return f"blend test split ({test})", prompts
    base = list(PROBE_PROMPTS) + [
        "Write a haiku about the sea.",
        "What is the capital of France? Answer briefly.",
        "Sort the list [3, 1, 2] in Python and explain.",
        "Give three tips for writing tests.",
    ]
    return "doctor built-in prompts", base[:n]


def mode_acceptance(
    target, draft, prompts, num_steps: int = 3, max_new_tokens: int = 48, progress: bool = True
) -> dict:
    """The same draft through draftlab.engine in EAGLE3 and EAGLE modes (greedy decoded once, reused)."""
    ids = encode_prompts(target, prompts)
    out, greedy = {}, None
    for mode in ("EAGLE3", "EAGLE"):
        res = compare(
            target,
            draft,
            ids,
            SpecConfig(mode=mode, num_steps=num_steps, topk=1, max_new_tokens=max_new_tokens),
            eval_set="doctor",
            greedy_results=greedy,
            warmup=1 if greedy is None else 0,
            progress=progress,
        )
        greedy = res["_greedy_results"]
        out[mode] = public(res)
    return out


def plot_acceptance(results: dict, title: str):
    """Bar chart of acceptance length per mode, with the 1.0 floor and the S + 1 ceiling."""
    import matplotlib.pyplot as plt

    modes = list(results)
    values = [results[m]["acceptance_length"] or 0.0 for m in modes]
    steps = results[modes[0]]["num_steps"]
    fig, ax = plt.subplots(figsize=(5, 3.6))
    bars = ax.bar(modes, values, color=["tab:green", "tab:red"][: len(modes)])
    for bar, v in zip(bars, values):
        ax.text(bar.get_x() + bar.get_width() / 2, v + 0.03, f"{v:.2f}", ha="center")
    ax.axhline(1.0, color="grey", ls="--", lw=1, label="1.0: no draft token accepted")
    ax.axhline(steps + 1, color="grey", ls=":", lw=1, label=f"{steps + 1}: ceiling for {steps} steps")
    ax.set_ylabel("acceptance length (tokens / verify step)")
    ax.set_title(title)
    ax.set_ylim(0, steps + 1.5)
    ax.legend(loc="upper right", fontsize=8)
    return fig
