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
# # 00 · Environment check
# **Question:** is this machine ready to train and check EAGLE-3 drafts for the chosen target?
# **In → out:** a target spec → library versions, the device, the target's shape and the
# SGLang-convention capture layers `[2, N//2, N-3]`, in `metrics.json` and one figure.
# **Hardware / runtime:** any; ~20 s (the embedded target is converted once, ~45 s the first time).

# %% tags=["parameters"]
RUN_DIR = "results/lab"  # the run folder; an existing one's run.json gives TARGET, PROFILE (and its sizes)
PROFILE = "quick"  # smoke | quick | full; the defaults below are quick's (draftlab run sets it)
TARGET = "embedded"  # embedded (real weights) | tiny (random: figures stamped "not a result") | folder | .gguf | Hub id
DEVICE = "auto"  # auto | cpu | cuda
SEED = 0  # random seed for everything in this notebook

# %%
from draftlab.environment_check import environment
from draftlab.run import notebook as nb

run = nb.start("00_environment_check", globals())

# %% [markdown]
# ## Libraries and device

# %%
versions = environment.library_versions()
device_info = environment.device_info(run.device)
environment.show({**versions, **device_info})

# %% [markdown]
# ## The target and where EAGLE-3 reads its hidden states
# SGLang's layer ids mean "the input of decoder layer i", which is `hidden_states[i]` in
# transformers' `output_hidden_states` tuple (index 0 is the embedding output).

# %%
shape = environment.target_shape(TARGET, run.device)
environment.show(shape)

# %%
fig = environment.plot_capture_layers(shape)
nb.save_figure(run, fig, "capture_layers")

# %%
nb.save_metrics(run, {"versions": versions, "device": device_info, "target": shape})

# %% [markdown]
# ## Findings
# - The table above records the exact library versions and device of this run.
# - The draft's `fc` takes `3 × hidden_size` inputs (the three captured states); SGLang must be
#   started with `--speculative-algorithm EAGLE3` for it to receive them.
