"""Notebook 06's runs: every reference-engine measurement it makes, as calls the notebook strings together.

Greedy decoding runs once per (evaluation set, dtype) and is reused by every speculative run on
the same prompts, so each speedup compares the same engine on the same prompts. A row is
`engine.public(compare(...))` plus the draft's name, which is what benchmark_acceptance.report
tables and plots.
"""

from __future__ import annotations

from pathlib import Path

from draftlab.benchmark_acceptance import breakeven
from draftlab.benchmark_acceptance.live import compare_live, load_eval_set
from draftlab.benchmark_acceptance.lookup import lookup_acceptance
from draftlab.benchmark_acceptance.report import plot_speedup_by_chain, table
from draftlab.benchmark_acceptance.sglang_live import fit_server_costs, plot_breakeven_beside
from draftlab.core.run_folder import RunFolder
from draftlab.engine import SpecConfig, compare, encode_prompts, public
from draftlab.model.draft import load_draft
from draftlab.model.target import load_target


def load_drafts(run_dir, archs, target) -> dict:
    """Notebook 04's exports, read as SGLang reads them (config.json + model.safetensors)."""
    drafts = {}
    for arch in archs:
        folder = RunFolder(run_dir).draft(arch)
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{folder}: no exported draft; run notebook 04_train_draft first")
        drafts[arch] = load_draft(folder, target)
    return drafts


def load_sets(target, names, run_dir, samples: int) -> dict:
    """Evaluation set name -> prompt token ids (core.records.prompt_messages of each row)."""
    return {
        name: encode_prompts(target, [p["messages"] for p in load_eval_set(name, run_dir=run_dir, limit=samples)])
        for name in names
    }


def set_sizes(sets: dict) -> list[dict]:
    return [
        {"eval_set": k, "samples": len(v), "mean prompt tokens": sum(map(len, v)) / len(v)} for k, v in sets.items()
    ]


def measure(target, draft, ids, eval_set: str, arch: str, greedy=None, max_new_tokens: int = 64, **spec):
    """One speculative run against greedy decoding: (row, greedy results to reuse on these prompts)."""
    cfg = SpecConfig(max_new_tokens=max_new_tokens, **spec)
    res = compare(target, draft, ids, cfg, eval_set=eval_set, greedy_results=greedy, warmup=0 if greedy else 1)
    return {**public(res), "arch": arch}, res["_greedy_results"]


def runs_by_set(target, drafts: dict, sets: dict, steps: int, max_new_tokens: int):
    """Every draft on every set at S = steps (EAGLE3): (rows, greedy results by set)."""
    rows, greedy = [], {}
    for name, ids in sets.items():
        for arch, draft in drafts.items():
            row, greedy[name] = measure(
                target, draft, ids, name, arch, greedy.get(name), max_new_tokens, mode="EAGLE3", num_steps=steps
            )
            rows.append(row)
    return rows, greedy


def wrong_mode_runs(
    target, drafts: dict, ids, eval_set: str, greedy, steps: int, max_new_tokens: int, enabled: bool = True
) -> list:
    """The EAGLE-3 draft under `--speculative-algorithm EAGLE` (final state only): should sit near 1.0.
    None without an EAGLE-3 draft or when not `enabled` (06's WRONG_MODE)."""
    if not enabled or "eagle3" not in drafts:
        return []
    row, _ = measure(
        target, drafts["eagle3"], ids, eval_set, "eagle3", greedy, max_new_tokens, mode="EAGLE", num_steps=steps
    )
    return [row]


def runs_by_chain(
    target, drafts: dict, archs, ids, eval_set: str, chain_steps, done: list, greedy, max_new_tokens: int
) -> list:
    """Each arch at every chain length S, reusing the runs of `done` that already measured one."""
    rows = []
    for arch in archs:
        for s in chain_steps:
            same = [r for r in done if (r["arch"], r["eval_set"], r["num_steps"]) == (arch, eval_set, s)]
            if same:
                rows.append(same[0])
                continue
            row, _ = measure(
                target, drafts[arch], ids, eval_set, arch, greedy, max_new_tokens, mode="EAGLE3", num_steps=s
            )
            rows.append(row)
    return rows


def lookup_by_chain(ids, greedy, eval_set: str, chain_steps) -> list:
    """Prompt lookup (n-gram drafting) simulated on the same greedy outputs, by S: the line to clear."""
    outputs = [g.tokens for g in greedy]
    return [
        {
            "eval_set": eval_set,
            "arch": "prompt lookup",
            "mode": "(n-gram)",
            "num_steps": s,
            "samples": len(ids),
            "acceptance_length": lookup_acceptance(ids, outputs, s)["acceptance_length"],
        }
        for s in chain_steps
    ]


def lookup_by_set(sets: dict, greedy: dict, steps: int) -> list:
    return [
        {"eval_set": name, **lookup_acceptance(ids, [g.tokens for g in greedy[name]], steps)}
        for name, ids in sets.items()
    ]


def fast_dtype_runs(
    target_spec: str,
    device: str,
    dtype: str,
    fast_dtype: str,
    draft_dir,
    arch: str,
    ids,
    eval_set: str,
    chain_steps,
    trees,
    tree,
    steps: int,
    max_new_tokens: int,
) -> list:
    """The chain sweep and trees (K, D) again with target and draft in `fast_dtype` (greedy rerun in it);
    nothing when it is unset or equal to `dtype`. trees: FAST_TREES, else the one `tree`, else none."""
    if not fast_dtype or fast_dtype == dtype:
        return []
    trees = trees or ([tree] if tree else [])
    fast_target = load_target(target_spec, device=device, dtype=fast_dtype)
    fast_draft = load_draft(draft_dir, fast_target)
    rows, greedy = [], None
    for s in chain_steps:
        row, greedy = measure(
            fast_target, fast_draft, ids, eval_set, arch, greedy, max_new_tokens, mode="EAGLE3", num_steps=s
        )
        rows.append(row)
    # trees too: on a launch-bound GPU a verify of D tokens costs about what a chain's S + 1 do
    for k, d in trees:
        row, _ = measure(
            fast_target,
            fast_draft,
            ids,
            eval_set,
            f"{arch} tree K={k} D={d}",
            greedy,
            max_new_tokens,
            mode="EAGLE3",
            num_steps=steps,
            topk=k,
            num_draft_tokens=d,
        )
        rows.append(row)
    return rows


def tree_runs(target, draft, arch: str, ids, eval_set: str, greedy, tree, steps: int, max_new_tokens: int) -> list:
    """One tree run (topk K, D verified tokens) when `tree` = (K, D) is given."""
    if not tree:
        return []
    row, _ = measure(
        target,
        draft,
        ids,
        eval_set,
        arch,
        greedy,
        max_new_tokens,
        mode="EAGLE3",
        num_steps=steps,
        topk=tree[0],
        num_draft_tokens=tree[1],
    )
    return [row]


def breakeven_fits(chain: list, archs) -> tuple[dict, dict, str | None]:
    """Cycle-cost fits and their checks per arch with at least two chain lengths; the arch to plot."""
    fits, checks = {}, {}
    for arch in archs:
        arch_rows = [r for r in chain if r["arch"] == arch]
        if len({r["num_steps"] for r in arch_rows}) >= 2:
            fits[arch] = breakeven.fit_from_runs(arch_rows)
            checks[arch] = breakeven.check(arch_rows, fits[arch])
    model_arch = "eagle3" if "eagle3" in fits else next(iter(fits), None)
    return fits, checks, model_arch


def plot_breakeven(model, chain_steps, checks: list, title: str):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    breakeven.plot(ax, model, chain_steps, checks, title=title)
    return fig


def plot_speedup_dtypes(chain: list, fast: list, arch: str):
    """`arch`'s chain runs beside their FAST_DTYPE reruns; None without those (FAST_DTYPE unset)."""
    return plot_speedup_by_chain([r for r in chain if r["arch"] == arch] + fast) if fast else None


def breakeven_figure(fits: dict, checks: dict, model_arch: str | None, chain_steps, setting: str):
    """The break-even curve of `model_arch`'s fit with its checked runs; None without a fit (one S only)."""
    if model_arch is None:
        return None
    model = fits[model_arch]
    return plot_breakeven(
        model,
        chain_steps,
        checks[model_arch],
        f"{model_arch} on {setting}: v={model.verify_cost:.2f}, c={model.draft_cost:.3f}",
    )


def checks_table(checks: dict):
    """breakeven_fits' checks of every arch, one line per run."""
    import pandas as pd

    return pd.DataFrame([{**c, "arch": arch} for arch in checks for c in checks[arch]])


def live_runs(baseline_url: str, spec_urls: dict, eval_set: str, run_dir, samples: int, **kwargs):
    """Live SGLang endpoints on the eval set's first `samples` prompts (live.compare_live's table);
    None without a baseline URL."""
    if not baseline_url:
        return None
    prompts = [p["messages"] for p in load_eval_set(eval_set, run_dir=run_dir, limit=samples)]
    return compare_live(baseline_url, dict(spec_urls), prompts, eval_set=eval_set, **kwargs)[0]


def sglang_study_dir(study: str, run_dir) -> Path:
    """06's SGLANG_STUDY, else RUN_DIR/sglang/study."""
    return Path(study) if study else RunFolder(run_dir).sglang_study


def sglang_breakeven(study: Path, fits: dict, checks: dict, model_arch: str | None, steps: int):
    """(the break-even model fitted to SGLang's cycle times with its rates, the figure beside the
    engine's); (None, None) when `study` holds no windows."""
    if not (Path(study) / "windows.jsonl").is_file():
        return None, None
    server_model, server_rates = fit_server_costs(study)
    fig = plot_breakeven_beside(
        fits.get(model_arch) if model_arch else None,
        checks.get(model_arch, []) if model_arch else [],
        server_model,
        server_rates,
        steps,
    )
    return {"model": breakeven.as_dict(server_model), "rates": server_rates}, fig


def sglang_rates_table(server_fit: dict | None):
    """SGLang's measured rates beside the fit's predictions; None without a study."""
    import pandas as pd

    return pd.DataFrame(server_fit["rates"]) if server_fit else None


def predict_lookup(lookup_rows: list, fits: dict, model_arch: str | None) -> list:
    """Prompt lookup drafts for free (c ~ 0): a cycle costs one verify v, so speedup = acceptance / v."""
    for r in lookup_rows:
        r["predicted_speedup"] = r["acceptance_length"] / fits[model_arch].verify_cost if model_arch else None
    return lookup_rows


def records(rows: list):
    return table(rows).to_dict(orient="records") if rows else None


def metrics(
    *,
    device,
    dtype,
    max_new_tokens,
    sets,
    main,
    wrong,
    chain,
    fast,
    lookup_main,
    lookup_rows,
    tree,
    fits,
    checks,
    example,
    live,
    sglang=None,
) -> dict:
    """metrics.json's 06 section: every table, the lossless flag over all runs in `dtype`, the fits."""
    return {
        "device": device,
        "dtype": dtype,
        "max_new_tokens": max_new_tokens,
        "eval_sets": {k: len(v) for k, v in sets.items()},
        "by_set": table(main).to_dict(orient="records"),
        "wrong_mode": records(wrong),
        "by_chain": table(chain).to_dict(orient="records"),
        "by_chain_fast_dtype": records(fast),
        "prompt_lookup": {"by_set": lookup_main, "by_chain": lookup_rows},
        "tree": records(tree),
        "position_acceptance": {f"{r['arch']} {r['eval_set']}": r["speculative"]["position_acceptance"] for r in main},
        "accept_histogram": {f"{r['arch']} {r['eval_set']}": r["speculative"]["accept_histogram"] for r in main},
        "lossless": all(r["lossless"] for r in main + wrong + chain + tree),
        "breakeven_fit": {arch: breakeven.as_dict(m) for arch, m in fits.items()},
        "breakeven_check": checks,
        "worked_example": example,
        "live": live.to_dict(orient="records") if live is not None else None,
        "sglang_breakeven": sglang,  # the break-even model fitted to SGLang's own cycle times (section 8)
    }
