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
# # 01 · Dataset discovery
# **Question:** which public datasets are the best candidates to train a draft for this workload, and why?
# **In → out:** `data/catalog.yaml` (+ a live Hugging Face Hub search when it answers) → a ranked table with
# the reason behind every point, `RUN_DIR/data/catalog/`, one figure and `metrics.json`.
# **Hardware / runtime:** any; a few seconds (the Hub probe gives up after `HUB_TIMEOUT_S`).

# %% tags=["parameters"]
RUN_DIR = "results/lab"  # the run folder; an existing one's run.json gives TARGET, PROFILE (and its sizes)
PROFILE = "quick"  # smoke | quick | full; the defaults below are quick's (draftlab run sets it)
TARGET = "embedded"  # embedded | tiny | local folder | file.gguf | Hugging Face Hub id (not used here)
DEVICE = "auto"  # auto | cpu | cuda (not used here)
SEED = 0  # random seed for everything in this notebook
CATALOG = "data/catalog.yaml"  # the catalog snapshot
LIVE = True  # search the Hub too (falls back to the snapshot, saying so, when it does not answer)
KEYWORDS = ["code instruct", "code feedback", "code alpaca", "sharegpt", "agent trajectories", "commitpack"]  # search
HUB_LIMIT = 20  # datasets per keyword, sorted by downloads
HUB_TIMEOUT_S = 3.0  # seconds to wait for the Hub before using the snapshot
DOMAIN = "code"  # workload: code | agentic | chat | reasoning
MULTI_TURN = True  # does the workload hold multi-turn conversations?
COMMERCIAL = True  # will the draft be used commercially (non-commercial licenses score -5)?
MIN_ROWS = 10000  # rows at which a dataset starts to count as sizeable

# %%
import json

import pandas as pd

from draftlab.dataset_discovery import catalog
from draftlab.run import notebook as nb

run = nb.start("01_dataset_discovery", globals())
out_dir = run.data("catalog")

# %% [markdown]
# ## The catalog snapshot
# Facts come from each dataset's card; `unknown` marks what could not be verified.

# %%
entries = catalog.load_catalog(CATALOG)
pd.DataFrame(entries)[["hub_id", "category", "rows", "license", "schema", "turns"]]

# %% [markdown]
# ## Live discovery
# Keyword search on the Hub, sorted by downloads, reading license, size and language from card
# metadata. Without a reachable Hub this says so and keeps the snapshot as it is.

# %%
found = catalog.discover(KEYWORDS, HUB_LIMIT, HUB_TIMEOUT_S) if LIVE else catalog.Discovery(
    False, "LIVE is False: using the catalog snapshot (data/catalog.yaml) as it is.")
print(found.message)
merged = catalog.enrich(entries, found)
print(f"{len(merged)} candidates ({len(merged) - len(entries)} new from the Hub)")

# %% [markdown]
# ## Ranking for the workload
# license (permissive +3, unknown 0, non-commercial −5 for commercial use) + size (log scale) +
# format (an adapter reads it +2) + turns (multi-turn +1.5 when the workload is) + domain relevance.

# %%
workload = catalog.Workload(domain=DOMAIN, multi_turn=MULTI_TURN, commercial=COMMERCIAL, min_rows=MIN_ROWS)
table = catalog.score(merged, workload)
with pd.option_context("display.max_colwidth", 200):
    display(table)

# %%
fig = catalog.plot_scores(table)
nb.save_figure(run, fig, "scores")

# %%
table.to_csv(out_dir / "scores.csv", index=False)
(out_dir / "catalog.json").write_text(catalog.catalog_json(merged))
(out_dir / "discovery.json").write_text(json.dumps({"online": found.online, "message": found.message}, indent=2))
print(sorted(p.name for p in out_dir.iterdir()))

# %%
nb.save_metrics(run, {
    "candidates": len(merged),
    "hub_online": found.online,
    "hub_message": found.message,
    "by_category": table["category"].value_counts().to_dict(),
    "unknown_license": int((table["license"] == "unknown").sum()),
    "top5": table.head(5)[["hub_id", "score"]].to_dict("records"),
})

# %% [markdown]
# ## Findings
# - The ranking favours permissively licensed, adapter-ready code sets; multi-turn code data
#   (Code-Feedback) ranks first for a multi-turn coding workload.
# - Several licenses could not be verified from here (`unknown`, scored 0): read those cards before use.
# - `params/blend-recommended.yaml` blends the campaign's four recommended sets for users with Hub
#   access; without it, notebook 02 blends the offline sources.
