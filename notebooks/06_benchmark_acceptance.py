# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: draftlab
#     language: python
#     name: draftlab
# ---

# %% [markdown]
# # 06 · Benchmark acceptance: acceptance length, speedup, and will the draft pay off?
# **Question:** how many tokens does each verify step of the trained drafts yield (by evaluation
# set, chain length and draft position), how fast is speculative decoding against plain greedy
# decoding in the same engine, and what acceptance length would break even?
# **In → out:** `RUN_DIR/drafts/{eagle3,eagle1}/` (notebook 04), `RUN_DIR/data/blend/test.jsonl`
# (notebook 02), HumanEval → tables, five figures, `metrics.json`; optional live SGLang endpoints.
# **Hardware / runtime:** smoke (tiny target) ~1 min on a CPU; quick (embedded target, a few short
# answers) ~3 min on a quiet 2-core CPU; full: one H200, fp32, CUDA graphs, a few minutes.

# %% tags=["parameters"]
RUN_DIR = "results/lab"  # the run folder; an existing one's run.json gives TARGET, PROFILE (and its sizes)
PROFILE = "quick"  # smoke | quick | full; the defaults below are quick's (draftlab run sets it)
TARGET = "embedded"  # embedded (real weights) | tiny (random: figures stamped "not a result") | folder | .gguf | Hub id
DEVICE = "auto"  # auto | cpu | cuda
SEED = 0  # random seed for everything in this notebook
DTYPE = "float32"  # engine dtype; fp32 keeps the lossless check exact (bf16 flips near-ties)
THREADS = 1  # torch CPU threads; 2 only on a quiet CPU (oversubscribed OpenMP threads made verify steps ~25x slower)
EVAL_SETS = ["blend", "humaneval"]  # blend: RUN_DIR/data/blend/test.jsonl (notebook 02), humaneval, or a .jsonl
SAMPLES = 2  # prompts per evaluation set (the first N)
MAX_NEW_TOKENS = 24  # new tokens per answer at most
ARCHS = ["eagle3", "eagle1"]  # drafts from notebook 04 (RUN_DIR/drafts/<arch>)
MAIN_STEPS = 3  # chain length S for the per-set comparison
CHAIN_STEPS = [1, 3]  # chain lengths for the acceptance-by-S curve and the break-even fit (first set)
CHAIN_ARCHS = ["eagle3"]  # drafts swept over CHAIN_STEPS
TREE = [4, 8]  # [topk K, draft tokens D] for one tree run on the first set ([] to skip)
FAST_DTYPE = "bfloat16"  # also sweep CHAIN_STEPS with the first arch in this dtype (bf16: ~2x faster on a GPU); "": no
FAST_TREES = []  # [[K, D], ...] trees for the FAST_DTYPE runs ([] : TREE alone)
WRONG_MODE = True  # also run the eagle3 draft as --speculative-algorithm EAGLE would (expect ~1.0)
LIVE_BASELINE_URL = ""  # optional: a live SGLang baseline (same --max-running-requests as the speculative ones)
LIVE_SPEC_URLS = {}  # optional: {label: url} of speculative SGLang servers
LIVE_CONCURRENCY = [1, 8]  # live: concurrency levels
LIVE_REPEATS = 3  # live: measurement windows per level (for confidence intervals)
SGLANG_STUDY = ""  # a `draftlab bench sglang` folder to draw beside the engine ("": RUN_DIR/sglang/study if it exists)
COST_BENCH = False  # run `draftlab bench cost` on COST_TARGET here (GPU + SGLang, minutes); False: read COST_RESULTS
COST_TARGET = "data/configs/smollm2-135m"  # the shape to measure: a Hub id, a model folder or a config.json
COST_RESULTS = "results/cost-model"  # a `draftlab bench cost` results folder (table.csv) to draw ("": skip)
COST_BATCHES = [1, 4, 16, 64]  # batch sizes of the cost bench
COST_ACCEPTANCE = 4.10  # a measured acceptance length to project on every shape of COST_RESULTS ...
COST_SETTING = "chain6"  # ... at this setting (chainS or treeS-K-D)
EVAL_SUITE = "suite"  # sets of several kinds (eval_suite): suite | suite:NAME,... | traffic:FILE | "" to skip
SUITE_SAMPLES = 2  # prompts per set of the suite (the first N after decontamination; full: 64)
SUITE_TRAIN = "data/blend/train.jsonl"  # under RUN_DIR: the training file each set is decontaminated against

# %%

import pandas as pd
import torch

from draftlab.benchmark_acceptance import breakeven, report, sglang_figures, sweeps
from draftlab.model.target import load_target
from draftlab.run import notebook as nb

run = nb.start("06_benchmark_acceptance", globals())
nb.needs(run, "04_train_draft", *(["02_blend"] if "blend" in EVAL_SETS else []))  # what to run first, in one line
torch.set_num_threads(THREADS)

# %% [markdown]
# ## 1 · Target, drafts and evaluation sets
# Every figure below names its evaluation set and sample count. The drafts are the exports of
# notebook 04, loaded exactly as SGLang would read them (config.json + model.safetensors).

# %%
target = load_target(TARGET, device=run.device, dtype=DTYPE)
drafts = sweeps.load_drafts(run.dir, ARCHS, target)
sets = sweeps.load_sets(target, EVAL_SETS, run.dir, SAMPLES)
first = EVAL_SETS[0]
run.source = f"draftlab engine ({DTYPE}), " + ", ".join(f"{name} n={len(ids)}" for name, ids in sets.items())
pd.DataFrame(sweeps.set_sizes(sets))

# %% [markdown]
# ## 2 · Acceptance and speedup by evaluation set
# Greedy decoding runs once per set and is reused by every speculative run on that set (same
# engine, same prompts). `lossless` counts prompts whose speculative output equals greedy.

# %%
main, greedy = sweeps.runs_by_set(target, drafts, sets, MAIN_STEPS, MAX_NEW_TOKENS)
report.table(main)

# %% [markdown]
# ## 3 · The wrong server flag: the EAGLE-3 draft under `--speculative-algorithm EAGLE`
# SGLang then sends only the final hidden state: `fc` is skipped and the target's head replaces
# the trained one. Acceptance should collapse to about 1.0, with no error anywhere.

# %%
wrong = sweeps.wrong_mode_runs(target, drafts, sets[first], first, greedy[first], MAIN_STEPS, MAX_NEW_TOKENS,
                               enabled=WRONG_MODE)
report.shown(wrong)

# %% [markdown]
# ## 4 · Acceptance by chain length S (first evaluation set)
# Prompt lookup, the free n-gram drafter (`draftlab.benchmark_acceptance.lookup`), is simulated
# exactly on the same greedy outputs: the line a trained draft has to clear.

# %%
chain = sweeps.runs_by_chain(target, drafts, CHAIN_ARCHS, sets[first], first, CHAIN_STEPS, main, greedy[first],
                             MAX_NEW_TOKENS)
lookup_rows = sweeps.lookup_by_chain(sets[first], greedy[first], first, CHAIN_STEPS)
fig = report.plot_acceptance_by_chain(chain + lookup_rows)
nb.save_figure(run, fig, "acceptance_by_chain")
report.table(chain)[["arch", "S", "acceptance_length", "speedup", "decode_speedup", "lossless"]]

# %%
lookup_main = sweeps.lookup_by_set(sets, greedy, MAIN_STEPS)
pd.DataFrame(lookup_main)

# %% [markdown]
# The same sweep in `FAST_DTYPE` (when set): on a GPU a bf16 target step costs about half an fp32
# one, so the speedups here are the ones a bf16 deployment would see. Greedy decoding is rerun in
# that dtype; `lossless` there compares bf16 with bf16, and a verify of S + 1 tokens can still
# flip a near-tie that one-token decoding would not.

# %%
fast = sweeps.fast_dtype_runs(TARGET, run.device, DTYPE, FAST_DTYPE, run.folder.draft(CHAIN_ARCHS[0]),
                              CHAIN_ARCHS[0], sets[first], first, CHAIN_STEPS, FAST_TREES, TREE, MAIN_STEPS,
                              MAX_NEW_TOKENS)
fig = sweeps.plot_speedup_dtypes(chain, fast, CHAIN_ARCHS[0])  # None without FAST_DTYPE
nb.save_figure(run, fig, "speedup_by_chain_dtypes")
report.shown(fast, columns=["arch", "dtype", "S", "K", "D", "acceptance_length", "greedy_tok_s", "spec_tok_s",
                            "speedup", "lossless"])

# %%
fig = report.plot_acceptance_by_set(main + wrong)
nb.save_figure(run, fig, "acceptance_by_set")

# %% [markdown]
# ## 5 · Per-position acceptance and a tree
# a_i = P(draft token i accepted | tokens before it accepted). The tree run (topk K, D verified
# tokens, SGLang's selection by cumulative draft log-probability) shows what a wider draft buys.

# %%
tree = sweeps.tree_runs(target, drafts[ARCHS[0]], ARCHS[0], sets[first], first, greedy[first], TREE, MAIN_STEPS,
                        MAX_NEW_TOKENS)
fig = report.plot_position_acceptance(main + tree)
nb.save_figure(run, fig, "position_acceptance")
report.shown(tree)

# %%
fig = report.plot_throughput(main + wrong + tree)
nb.save_figure(run, fig, "throughput")

# %% [markdown]
# ## 6 · Break-even model
# Cycle cost C(S) = v + S·c in plain target steps (v: verify pass, c: one draft step), fitted by
# least squares on the chain runs' decode timings; predicted speedup = tokens per cycle / C(S),
# checked on chain lengths it was not fitted to (each S against the fit of the others); break-even
# acceptance L* = C(S). With fewer than three chain lengths, a cost at or below zero, or a held-out
# miss beyond 25%, the runs are drawn without a model and one line says why.

# %%
fits, checks, model_arch, verdicts = breakeven.fit_chain(chain, CHAIN_ARCHS)
print(breakeven.refusals(verdicts) or f"break-even model drawn for {sorted(fits)}")
fig = breakeven.figure(verdicts, f"{run.device} ({DTYPE}), {first} n={len(sets[first])}")
nb.save_figure(run, fig, "breakeven")
sweeps.checks_table(checks)

# %% [markdown]
# Prompt lookup by the same cost model: its drafting costs next to nothing on the device (c ≈ 0),
# so a cycle costs one verify, v, and its predicted speedup is its acceptance length / v.

# %%
lookup_rows = sweeps.predict_lookup(lookup_rows, fits, model_arch)
pd.DataFrame(lookup_rows)[["num_steps", "acceptance_length", "predicted_speedup"]]

# %% [markdown]
# The deployment that motivated draftlab: 90 tok/s without speculation, 82.3 tok/s with it at
# acceptance length 2.1 and 5 draft tokens (topk 1, so S = 4), assuming a verify costs one step.

# %%
example = breakeven.worked_example()
pd.Series(example)

# %% [markdown]
# ## 7 · Live SGLang endpoints (optional)
# Same prompts at temperature 0; acceptance length = sum(completion_tokens) / sum(spec_verify_ct)
# from `meta_info`; absent (not 1.0) for a server that reports no speculative fields.

# %%
live = sweeps.live_runs(LIVE_BASELINE_URL, LIVE_SPEC_URLS, first, run.dir, SAMPLES, concurrency=LIVE_CONCURRENCY,
                        repeats=LIVE_REPEATS, max_tokens=MAX_NEW_TOKENS)  # None without LIVE_BASELINE_URL
report.shown(live, "no live endpoints given")

# %% [markdown]
# ## 8 · Measured in SGLang (when a `draftlab bench sglang` study exists)
# The same break-even model fitted to SGLang's own cycle times at batch 1 (`sglang_live.fit_server_costs`),
# each measured run against the model at its own chain length, beside the engine's: SGLang's plain
# step is about 3x faster than the engine's, so each
# draft step costs relatively more there, and the same acceptance buys less speed.

# %%
study = sweeps.sglang_study_dir(SGLANG_STUDY, run.dir)
server_fit, fig = sglang_figures.engine_vs_sglang(study, fits.get(model_arch), checks.get(model_arch, []))  # or None
nb.save_figure(run, fig, "breakeven_engine_vs_sglang",
               source=f"{sglang_figures.sglang_source(study)} beside {run.source}")
report.shown(sweeps.sglang_rates_table(server_fit),
             f"no SGLang study at {study} (run `draftlab bench sglang --out {study}` on a GPU)")

# %% [markdown]
# ## 9 · Will speculation pay on another target? SGLang's cycle cost by shape
# `draftlab bench cost TARGET` serves random weights of the target's shape and a random draft in
# SGLang with the acceptance forced (`SGLANG_SIMULATE_ACC_LEN`), one server at a time, and fits what a
# speculative cycle costs in plain decode steps at each batch size. Read a curve where it crosses the
# dashed lines: the acceptance a draft needs to break even, for 1.5x and 2x. The figures are a
# cost model on random weights, measured on the GPU each row names, not a trained draft's speed.

# %%
from pathlib import Path  # noqa: E402 (this section's own imports)

from draftlab.benchmark_acceptance import cost_cli, cost_report  # noqa: E402
from draftlab.core.paths import repo_root  # noqa: E402

root = repo_root() or Path.cwd()  # relative paths in the parameters are the repository's
cost_dir = root / COST_RESULTS
cost_target = str(root / COST_TARGET) if (root / COST_TARGET).exists() else COST_TARGET  # else a Hub id
if COST_BENCH:
    cost_cli.run_bench_cost(cost_target, cost_dir, batches=",".join(map(str, COST_BATCHES)))
cost_rows, cost_fits, cost_refused = cost_report.load_results(cost_dir) if COST_RESULTS else (None, [], [])
report.shown(pd.DataFrame(cost_report.needed_table(cost_fits)) if cost_fits else None,
             f"no cost-model results at {COST_RESULTS!r} (run `draftlab bench cost {COST_TARGET}` on a GPU)")

# %%
fig = cost_report.plot(cost_rows, cost_fits) if cost_rows else None
nb.save_figure(run, fig, "cost_model", source=f"SGLang cost bench {COST_RESULTS} (random weights)")
print("\n".join(f"fit refused: {line}" for line in cost_refused) or f"{len(cost_fits)} fits")
report.shown(pd.DataFrame(cost_report.projection(cost_fits, COST_ACCEPTANCE, COST_SETTING)) if cost_fits else None,
             f"no fit for {COST_SETTING} to project acceptance {COST_ACCEPTANCE} on")

# %% [markdown]
# ## 10 · The evaluation suite: acceptance per kind of prompt
# A draft measured only on the source it trained on reads high. Each set of the suite
# (`data/catalog.yaml` `eval_sets`: HumanEval, MT-bench first and second turns, GSM-Symbolic word problems,
# IFBench instructions, passages to summarise) loses the prompts that overlap the training file (a shared
# 13-word n-gram or a MinHash near-duplicate), then the first draft runs at chain `MAIN_STEPS` on each.
# The mean is over the general sets (all but the docstring-derived held-out split); `draftlab bench sglang
# --eval-set suite` gives the same table from SGLang (OUT/eval_suite.json).

# %%
from draftlab.benchmark_acceptance import eval_suite  # noqa: E402 (this section's own import)

suite_train = [str(run.dir / SUITE_TRAIN)] if (run.dir / SUITE_TRAIN).is_file() else []
suite_sets, suite_report = (eval_suite.prepare(EVAL_SUITE, run.dir, suite_train, SUITE_SAMPLES) if EVAL_SUITE
                             else ([], {}))
suite_rows = eval_suite.engine_table(target, drafts[ARCHS[0]], suite_sets, MAIN_STEPS, MAX_NEW_TOKENS)
report.shown(eval_suite.suite_frame(suite_rows, suite_report) if suite_rows else None, "EVAL_SUITE is empty: no suite")

# %%
fig = eval_suite.plot_per_set(suite_rows, f"{ARCHS[0]} S={MAIN_STEPS} per set ({DTYPE})") if suite_rows else None
nb.save_figure(run, fig, "eval_suite", source=f"draftlab engine ({DTYPE}), suite {EVAL_SUITE} n<={SUITE_SAMPLES}/set")
eval_suite.save_summary(run.dir / "eval_suite.json", ARCHS[0], suite_rows, suite_report)

# %%
nb.save_metrics(run, sweeps.metrics(device=run.device, dtype=DTYPE, max_new_tokens=MAX_NEW_TOKENS, sets=sets,
                                    main=main, wrong=wrong, chain=chain, fast=fast, lookup_main=lookup_main,
                                    lookup_rows=lookup_rows, tree=tree, fits=fits, checks=checks, example=example,
                                    live=live, sglang=server_fit)
                | {"breakeven_refused": {a: v.reason for a, v in verdicts.items() if v.model is None}})

# %% [markdown]
# ## Findings
# - Read the tables above for this run's figures; every acceptance length is
#   sum(completion tokens) / sum(verify steps) with the bonus (and the prefill's first token)
#   counted, as SGLang reports it.
# - `lossless` must read n/n in `DTYPE` (fp32): speculative decoding at temperature 0 emits exactly
#   the target's greedy tokens. In `FAST_DTYPE` (bf16) a verify of several tokens can flip a
#   near-tie that one-token decoding would not, so k/n < n/n there is rounding, not a bug; only
#   runs at n/n count as the batch-1 speedup in summary.json.
# - The EAGLE-3 draft under the EAGLE flag should sit near 1.0: the silent failure mode.
# - A trained draft is worth its training only where its curve clears prompt lookup's.
# - On a compute-bound CPU a verify pass of S + 1 tokens costs more than one decode step (v > 1),
#   so break-even needs a higher acceptance length than on a GPU, where v ≈ 1 and the draft step
#   cost c decides.
