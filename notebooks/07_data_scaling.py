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
# # 07 · Data scaling: is 10x more regenerated data worth its regeneration time?
# **Question:** how does acceptance length grow with the number of regenerated training
# conversations, for EAGLE-3 and for the EAGLE-1-style draft, and what would 10x more data buy?
# **In → out:** `RUN_DIR/data/regen/` (notebook 03; and 04's drafts when trained with the same
# recipe) → drafts on nested subsets, held-out acceptance (simulated, and real chain decoding at
# S steps), fitted curves with 95% bands, the extrapolation and its cost, two figures, `metrics.json`.
# **Hardware / runtime:** quick ~3 min on a 2-core CPU (tiny subsets); full ~15 min on one H200 (estimated
# from 6.7 training steps/s: 2,347 steps per architecture at five sizes; not yet run at these sizes).
# Resumable: each (architecture, size) is saved as soon as it is done and skipped on a rerun.

# %% tags=["parameters"]
RUN_DIR = "results/lab"  # the run folder; an existing one's run.json gives TARGET, PROFILE (and its sizes)
PROFILE = "quick"  # smoke | quick | full; the defaults below are quick's (draftlab run sets it)
TARGET = "embedded"  # embedded (real weights) | tiny (random: figures stamped "not a result") | folder | .gguf | Hub id
DEVICE = "auto"  # auto | cpu | cuda
SEED = 0  # random seed: the subsets' shuffle, training, bootstrap
SIZES = [4, 8, 16]  # nested subset sizes (training conversations); sizes above the data are capped to it
ARCHS = ["eagle3", "eagle1"]  # architectures to train on every subset
EPOCHS = 1.0  # epochs over each subset: the same training budget per sample for every size
RECIPE_FROM_04 = False  # take the training recipe (epochs, lr, vocab, lengths, ...) from 04's checkpoint
DRAFT_VOCAB_SIZE = 512  # draft vocabulary (most frequent assistant tokens of each subset)
MAX_LEN = 384  # tokens per conversation (longer ones are truncated)
TTT_STEPS = 3  # training-time-test unroll; the simulated acceptance length is at most TTT_STEPS + 1
BATCH_TOKENS = 768  # padded tokens per micro-batch
MAX_BATCH = 4  # conversations per micro-batch at most
LR = 0.001  # AdamW peak learning rate (warmup, cosine decay)
INTERMEDIATE_SIZE = 768  # draft MLP width; 0 for the target's
HIDDEN = "offline"  # online: target forward in every step | offline: each subset's states stored once for both archs
SIDE_BY_SIDE = False  # with HIDDEN online: train a subset's archs at once, one process each (as notebook 04)
CHECKPOINT_EVERY = 100  # training steps between checkpoints (a killed run resumes from the last)
VAL_SAMPLES = 6  # held-out conversations for the simulated acceptance length
SPEC_PROMPTS = 0  # held-out prompts decoded for real (chain, reference engine); 0 skips it
SPEC_STEPS = 6  # chain length S for that decoding
SPEC_MAX_NEW_TOKENS = 8  # tokens generated per prompt there
INCLUDE_04_DRAFTS = True  # add 04's drafts (all the data) as points when their recipe equals this one
THREADS = 1  # torch CPU threads (1 is faster on a busy shared CPU)
FACTOR = 10.0  # extrapolate to FACTOR x the largest subset
GOAL = 4.0  # acceptance length goal drawn on the figure (the EAGLE-3 chain at six steps)
SGLANG_SIZE_CURVE = ""  # the recipe study's size_curve.json (results/recipes/size-curve/); "" skips the SGLang curve

# %%
from draftlab import data_scaling as scaling
from draftlab.model.target import load_target
from draftlab.run import notebook as nb

run = nb.start("07_data_scaling", globals())
nb.needs(run, "03_regenerate", *(["04_train_draft"] if RECIPE_FROM_04 else []))  # what to run first, in one line
work = run.dir / "scaling"

# %% [markdown]
# ## 1 · Nested subsets and the recipe
# One seeded shuffle of the regenerated training set; the subset of size n is its first n rows,
# so every subset holds the smaller ones. Every size is trained for the same number of epochs,
# so a smaller subset also gets fewer optimizer steps: the curve mixes data volume with
# optimisation. Check that the recipe has converged before reading it as a data curve: on one H200,
# 5 epochs over the same 21,612 conversations instead of 2 took simulated acceptance from 2.34 to
# 3.94 (an earlier published run, in git history: results/README.md), beyond what the
# 2-epoch study predicted for 10x data.

# %%
plan = scaling.prepare(run.dir, work, SIZES, SEED, VAL_SAMPLES)
settings, recipe_notes = scaling.study_settings(
    run.dir, from_04=RECIPE_FROM_04, archs=ARCHS, epochs=EPOCHS, draft_vocab_size=DRAFT_VOCAB_SIZE, max_len=MAX_LEN,
    ttt_steps=TTT_STEPS, batch_tokens=BATCH_TOKENS, max_batch=MAX_BATCH, lr=LR, checkpoint_every=CHECKPOINT_EVERY,
    val_samples=VAL_SAMPLES, spec_prompts=SPEC_PROMPTS, spec_steps=SPEC_STEPS, spec_max_new_tokens=SPEC_MAX_NEW_TOKENS,
    seed=SEED, threads=THREADS, intermediate_size=INTERMEDIATE_SIZE, hidden=HIDDEN,
    side_by_side=SIDE_BY_SIDE)
scaling.print_plan(plan, settings, recipe_notes)

# %% [markdown]
# ## 2 · Train and measure every (architecture, size)
# Smallest sizes first, architectures interleaved. Each draft is exported in SGLang's format and
# measured from that export: simulated acceptance length `1 + a0 + a0·a1 + ...` from the per-step
# accuracies on held-out conversations (bootstrap standard error over conversations), and, when
# `SPEC_PROMPTS > 0`, real chain decoding at `SPEC_STEPS` steps in the reference engine.

# %%
target = load_target(TARGET, device=run.device)
extra_points, extra_notes = scaling.points_from_04(run.dir, settings.train, include=INCLUDE_04_DRAFTS)
scaling.print_notes(extra_notes)
study = scaling.run_study(target, TARGET, run.device, plan, work, settings, extra_points)
results = study["results"]
scaling.summary_table(results)

# %% [markdown]
# ## 3 · Fitted curves and the 10x extrapolation
# Three fits per architecture with `scipy.optimize.curve_fit`, weighted by each point's standard
# error: log-linear `a + b·log10(n)` (keeps rising: optimistic), saturating `y∞ − b·(n/1000)^−c`
# (levels off: conservative; needs 4+ points) and a logistic in log n under a given ceiling (a chain of
# S accepts at most S + 1; simulated acceptance at most the training-time-test depth + 1), for points
# that bend upwards. Bands are 95% intervals from
# the parameter covariance, inflated by the reduced chi-square when points scatter more than their
# errors. The extra data is priced with the regeneration rate measured in notebook 03.

# %%
from draftlab.data_scaling.fits import refusal

fits = scaling.fit_all(results, ceiling=scaling.sim_ceiling(results))
chain_fits = scaling.fit_all(results, "chain_acceptance_length", ceiling=scaling.chain_ceiling(results))
regen = scaling.regen_throughput(run.dir)
extrapolation = scaling.extrapolate(fits, results, regen, FACTOR, GOAL)
chain_extrapolation = scaling.extrapolate(chain_fits, results, regen, FACTOR, GOAL)
scaling.print_regeneration(regen)
print(refusal(fits) or f"curves fitted on {len({r['n'] for r in results})} data sizes")
fig = scaling.plot_scaling(results, fits, FACTOR, GOAL)
nb.save_figure(run, fig, "acceptance_vs_data")

# %%
fig = scaling.plot_chain_scaling(results, chain_fits, FACTOR, GOAL, SPEC_STEPS)  # None without real decoding
nb.save_figure(run, fig, "chain_acceptance_vs_data")
fig = scaling.plot_extrapolation(extrapolation)  # None when no fit may be extrapolated
nb.save_figure(run, fig, "extrapolation")
scaling.extrapolation_table(extrapolation)

# %%
summary_lines = scaling.study_findings(results, extrapolation, chain_extrapolation, study["deferred"])
print("\n".join(summary_lines))

# %%
nb.save_metrics(run, scaling.study_metrics(plan, settings, plan.notes + recipe_notes + extra_notes, study, fits,
                                           chain_fits, regen, extrapolation, chain_extrapolation, summary_lines))

# %% [markdown]
# ## 4 · The same question in SGLang
# The recipe study (`studies/recipes`, read here as its record `size_curve.json`) trains data-size rows with the
# reference recipe on the regenerated set's first 1,351 / 2,702 / 5,403 / 10,806 conversations and on all
# of it (`base`), each at 5 epochs (steps in proportion to the samples), and measures every draft in SGLang at chain
# S = 6 on the same
# 64 held-out prompts. Their acceptance, with a bootstrap error over prompts, gets the fits above and the
# logistic `1 + S / (1 + (n50/n)^k)`, whose ceiling S + 1 is the chain's, not fitted (its band assumes that
# shape: a ceiling below 7 would bend it sooner); the extra
# data is priced at the study's regeneration rate and the largest point's training time. An SGLang figure,
# not a simulated one: the number a server user gets. Since every size ran 5 epochs, the curve mixes data
# with steps: the second figure sets rows with other passes (10 epochs on the same data, twice the data at
# the same steps) beside the size rows, against the optimizer steps.

# %%
sglang_curve, figs = scaling.read_size_curve(SGLANG_SIZE_CURVE, FACTOR, GOAL)
for name, fig in figs.items():
    nb.save_figure(run, fig, name)

# %% [markdown]
# ## Findings
# The printed summary above states, from this run's measurements only, acceptance length per size
# and architecture, both fits' predictions at 10x data with 95% bands, and the regeneration hours
# that data would cost; `results/reference/README.md` discusses the reference run on one H200.
# How to read it: if the log-linear band at 10x stays below the goal, more of the same data will
# not close the gap; if the saturating fit's ceiling is close to the current point, the draft (or
# its recipe: epochs, vocabulary, TTT length), not the data volume, is what limits acceptance.
# Before paying for regeneration, train the largest subset longer (04's `EPOCHS`) and compare.
