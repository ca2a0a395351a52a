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
# # 05 · Flag diagnosis: `draftlab doctor` and the hidden-state dimension story
# **Question:** which silent draft/target/flag mismatches does `draftlab doctor` catch, and what
# does the one-flag bug (`--speculative-algorithm EAGLE` instead of `EAGLE3`) do to the draft's input?
# **In → out:** `RUN_DIR/drafts/eagle3` (notebook 04) and the target → doctor findings on good and
# broken inputs, the width table per mode (this target and the shipped 61-layer config), acceptance
# length of the same draft in `EAGLE3` and `EAGLE` modes (reference engine), `metrics.json`, one figure.
# **Hardware / runtime:** CPU; smoke ~30 s, quick ~1-2 min.

# %% tags=["parameters"]
RUN_DIR = "results/lab"  # the run folder; an existing one's run.json gives TARGET, PROFILE (and its sizes)
PROFILE = "quick"  # smoke | quick | full; the defaults below are quick's (draftlab run sets it)
TARGET = "embedded"  # embedded (real weights) | tiny (random: figures stamped "not a result") | folder | .gguf | Hub id
DEVICE = "auto"  # auto | cpu | cuda
SEED = 0  # random seed for everything in this notebook
BUILD_DRAFT_IF_MISSING = False  # no RUN_DIR/drafts/eagle3: export an untrained one (smoke; its figure says so)
DEPLOY_CONFIG = "data/configs/deepseek-v3-61layer"  # the 61-layer, 7168-wide target config shipped in the repo
EVAL_PROMPTS = 2  # prompts for the EAGLE3-vs-EAGLE acceptance comparison
MAX_NEW_TOKENS = 24  # tokens generated per prompt in that comparison
NUM_STEPS = 3  # chain draft steps (topk 1) in that comparison
PROBE_SERVER = False  # start a real `transformers serve` of the target and probe it (it has no spec fields)

# %%
from pathlib import Path

import pandas as pd

from draftlab.core.paths import repo_root
from draftlab.flag_diagnosis import cases as doctor_cases
from draftlab.flag_diagnosis import doctor, reproduce
from draftlab.flag_diagnosis.inputs import load_target_info
from draftlab.model.target import load_target
from draftlab.run import notebook as nb
from draftlab.sglang.commands import sglang_commands

run = nb.start("05_flag_diagnosis", globals())
if not BUILD_DRAFT_IF_MISSING:
    nb.needs(run, "04_train_draft")  # one line naming what to run first (04 needs 03 needs 02)
work = run.data("05_flag_diagnosis")
deploy_config = Path(DEPLOY_CONFIG) if Path(DEPLOY_CONFIG).is_absolute() else repo_root() / DEPLOY_CONFIG

# %% [markdown]
# ## 1 · The draft under test, checked with the commands draftlab prints for it
# `draftlab.sglang.commands.sglang_commands` writes the baseline and EAGLE3 launch lines; doctor checks the
# draft folder (config.json + safetensors header only) against the target and those lines.

# %%
draft_dir, draft_origin = doctor_cases.draft_for_run(run.dir, TARGET, BUILD_DRAFT_IF_MISSING, work)
target_info = load_target_info(TARGET)
commands = sglang_commands(str(target_info.config_path.parent), str(draft_dir))
print(f"draft: {draft_dir} ({draft_origin})")
for name, cmd in commands.items():
    print(f"{name:>8}: {cmd}")
result = doctor.diagnose(str(draft_dir), TARGET, [commands["baseline"], commands["eagle3"]])
doctor.findings_table(result["findings"])

# %% [markdown]
# SGLang's `set_eagle3_layers_to_capture` adds 1 to the ids in `eagle_aux_hidden_state_layer_ids`
# (they mean "output of layer i"), so `draftlab.model.export` writes the trained `hidden_states` indices
# minus one and records the indices themselves under `"draftlab"`, which doctor checks exactly.
#
# ## 2 · The one-flag bug, and every other mismatch in the contract
# The same launch line with `EAGLE` instead of `EAGLE3`: doctor names the bug and prints the fixed command.

# %%
flag_bug = doctor.diagnose(str(draft_dir), TARGET, [commands["eagle3"].replace("EAGLE3", "EAGLE")])
doctor.findings_table(flag_bug["findings"], hide_ok=True)

# %% [markdown]
# A library of broken inputs, one per check, each a copy of one correct export with one thing broken
# (built on the tiny target's shapes so it stays a few MB; the checks do not depend on the size).

# %%
library_good = doctor_cases.good_draft(work / "library" / "good", "tiny", draft_vocab_size=256)
cases = doctor_cases.build_cases(library_good, work / "library" / "cases", "tiny",
                                 str(repo_root() / "data/configs/deepseek-tiny"))
library = doctor_cases.run_library(cases)
library

# %% [markdown]
# ## 3 · What each mode sends the draft: this target, measured

# %%
target = load_target(TARGET, device=run.device, dtype="float32")
widths = reproduce.measured_widths(target)
pd.DataFrame(widths)

# %% [markdown]
# ## 4 · The same table for the 61-layer, 7168-wide deployment (from the shipped config.json)

# %%
deploy = load_target_info(str(deploy_config))
deploy_widths = doctor.mode_widths(deploy.config)
print(f"{deploy_config.name}: {deploy.num_layers} layers, hidden {deploy.hidden_size}, "
      f"capture {deploy.default_capture}, model_type {deploy.model_type}")
deploy_flag = doctor.diagnose(launches=[  # the config folder as --model-path: the doctor reads its widths
    f"python -m sglang.launch_server --model-path {deploy_config} --tp 8 --speculative-algorithm EAGLE "
    "--speculative-draft-model-path /models/eagle3-draft --speculative-num-steps 3 --speculative-eagle-topk 1 "
    "--speculative-num-draft-tokens 4"])
print(doctor.format_findings(deploy_flag["findings"]))
pd.DataFrame(deploy_widths)

# %% [markdown]
# ## 5 · Acceptance length of the same draft in both modes (reference engine `draftlab.engine`)
# `EAGLE3` feeds the three captured layers through fc and drafts with the draft's head + d2t;
# `EAGLE` feeds the final hidden state, skips fc and uses the target's head, as SGLang does.

# %%
from draftlab.model.draft import load_draft

draft = load_draft(draft_dir, target)
prompt_set, prompts = reproduce.eval_prompts(run.dir, EVAL_PROMPTS)
modes = reproduce.mode_acceptance(target, draft, prompts, num_steps=NUM_STEPS, max_new_tokens=MAX_NEW_TOKENS)
for mode, res in modes.items():
    print(f"{mode:>6}: acceptance length {res['acceptance_length']:.3f} over {res['speculative']['completion_tokens']} "
          f"tokens, lossless {res['lossless']}, speedup {res['speedup']:.2f}x ({prompt_set}, {len(prompts)} prompts)")
fig = reproduce.plot_acceptance(modes,
                                f"{target.name}: same draft, two --speculative-algorithm values\n({draft_origin})")
nb.save_figure(run, fig, "acceptance_by_mode",
               caveat="untrained draft: not a result" if draft_origin.startswith("untrained") else None,
               source=f"draftlab engine, {prompt_set} n={len(prompts)}, {MAX_NEW_TOKENS} new tokens, S={NUM_STEPS}")

# %% [markdown]
# ## 6 · Live probe of a real server without speculation
# A server that returns no `spec_verify_ct` gets acceptance length *absent*, never 1.0. (The
# near-1.0 cause ranking is tested against a loopback server answering in SGLang's shapes.)

# %%
probe_summary = None
if PROBE_SERVER:
    from draftlab.core.serve import LocalServer
    from draftlab.flag_diagnosis.probe import probe

    with LocalServer(target.path, log_path=work / "serve.log") as srv:
        report = probe(srv.base_url, model=srv.model, max_tokens=16, prompts=prompts[:1])
    print(doctor.format_probe(report))
    probe_summary = {"acceptance_length": report.acceptance_length, "note": report.acceptance_note,
                     "endpoint": report.endpoint, "server_info": report.server_info is not None}

# %%
nb.save_metrics(run, {
    "draft": str(draft_dir), "draft_origin": draft_origin,
    "doctor_on_draft": {"errors": result["errors"], "warnings": result["warnings"],
                        "problems": [f"{f.check}/{f.severity}" for f in result["findings"]
                                     if f.severity in ("error", "warning")]},
    "flag_bug_found": any(f.check == "algorithm" and f.severity == "error" for f in flag_bug["findings"]),
    "library": {"cases": len(library), "flagged": int(library["flagged"].sum())},
    "widths": {r["mode"]: r["width"] for r in widths},
    "deploy_widths": {r["mode"]: r["width"] for r in deploy_widths},
    "acceptance_length": {m: r["acceptance_length"] for m, r in modes.items()},
    "acceptance_eval": {"set": prompt_set, "prompts": len(prompts), "num_steps": NUM_STEPS,
                        "max_new_tokens": MAX_NEW_TOKENS},
    "lossless": {m: r["lossless"] for m, r in modes.items()},
    "probe": probe_summary,
})

# %% [markdown]
# ## Findings
# - doctor flags every case of the broken-input library with the expected check (table in section 2),
#   and prints the corrected flag or config line for each.
# - With `EAGLE3` the draft receives `3 × H` (1728 on the embedded target, 21504 on the 61-layer
#   config) and fc projects it to H; with `EAGLE` it receives H (576 / 7168), fc is bypassed and the
#   target's head replaces the draft's: the acceptance-length chart shows what that costs the same draft.
# - The acceptance numbers only mean something for a trained draft (quick/full, `draft_origin` in
#   metrics.json says which). An untrained smoke draft is noise in both modes; on the tiny random
#   target, which repeats tokens, an untrained draft in `EAGLE` mode can even look good, because the
#   target's own head applied to a near-copy of its final state re-predicts the repeated token.
