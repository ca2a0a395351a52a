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
# # 03 · Regenerate the blend with the target
# **Question:** what does the target itself answer to every blended prompt, and how fast, how
# often cut short, how reliably can we get it? A draft must learn the target's own outputs.
# **In → out:** `RUN_DIR/data/blend/{train,val}.jsonl` (notebook 02) →
# `RUN_DIR/data/regen/{train,val}.jsonl` (+ resumable work folders, server log), two figures.
# **Hardware / runtime:** smoke ~1 min (tiny target); quick ~4 min on this 2-core CPU (a
# `transformers serve` of SmolLM2-135M, ~30 tok/s); full: the batch backend on one GPU.

# %% tags=["parameters"]
RUN_DIR = "results/lab"  # the run folder; an existing one's run.json gives TARGET, PROFILE (and its sizes)
PROFILE = "quick"  # smoke | quick | full; the defaults below are quick's (draftlab run sets it)
TARGET = "embedded"  # the model that answers: embedded | tiny | local folder | file.gguf | Hub id
DEVICE = "auto"  # auto | cpu | cuda: where the local server or the batch backend runs
SEED = 0  # random seed (sampling seed sent with every request when TEMPERATURE > 0)
BACKEND = "server"  # server: OpenAI-compatible server + async client | batch: static-batch generate (GPU)
BASE_URLS = []  # running servers to use (e.g. SGLang); empty: start `transformers serve` for TARGET
SERVED_MODEL = ""  # `model` field for BASE_URLS servers (empty: the local server's folder path)
SGLANG_SERVERS = 0  # no BASE_URLS: start this many SGLang servers of TARGET on this GPU (0: transformers serve)
SGLANG_PREFIX = ""  # offline SGLang install for SGLANG_SERVERS (`draftlab sglang install`); "": SGLang importable here
SPLITS = ["train", "val"]  # blend splits to regenerate
MAX_TRAIN_ROWS = 80  # first N rows of the train split (0: all)
MAX_VAL_ROWS = 16  # first N rows of the val split (0: all)
MAX_TOKENS = 48  # max_tokens per answer
TEMPERATURE = 0.0  # 0: greedy
TOP_P = 1.0  # nucleus sampling
STOP = []  # stop strings
SYSTEM_POLICY = "keep"  # keep: as in the data | drop: remove system prompts | set: use SYSTEM_PROMPT
SYSTEM_PROMPT = ""  # the system prompt used when SYSTEM_POLICY is set
TRUNCATION = "keep_flag"  # answers cut at MAX_TOKENS: drop the row | keep_flag: keep, flagged in meta
MAX_ASSISTANT_TURNS = 1  # regenerate at most N assistant turns per conversation (0: all)
CONCURRENCY = 16  # in-flight requests per server
REQUEST_TIMEOUT = 300.0  # seconds per request
MAX_RETRIES = 5  # retries per request (connection errors, 429, 5xx, malformed answers)
BATCH_SIZE = 1024  # rows per generate call (batch backend)
BATCH_TOKENS = 0  # padded tokens per generate call at most (batch backend; bounds GPU memory); 0: no limit

# %%
import pandas as pd

from draftlab import regenerate as rg
from draftlab.model.target import load_tokenizer
from draftlab.regenerate import monitor
from draftlab.run import notebook as nb

run = nb.start("03_regenerate", globals())
nb.needs(run, "02_blend")  # one line naming what to run first when 02 has not run in RUN_DIR

# %% [markdown]
# ## 1 · Inputs: the blend's prompts

# %%
blend = run.folder.blend
inputs = {split: blend / f"{split}.jsonl" for split in SPLITS}
missing = [str(p) for p in inputs.values() if not p.is_file()]
if missing:
    raise FileNotFoundError(f"{missing}: missing; run notebook 02_blend first")
limits = {"train": MAX_TRAIN_ROWS, "val": MAX_VAL_ROWS}
source_rows = {split: rg.load_conversations(path, limits.get(split, 0)) for split, path in inputs.items()}
pd.DataFrame({split: {"rows": len(rows),
                      "multi-turn": sum(sum(m["role"] == "assistant" for m in r["messages"]) > 1 for r in rows)}
              for split, rows in source_rows.items()})

# %% [markdown]
# ## 2 · Regenerate
# Every assistant turn is asked again, turn by turn, with the regenerated history. Rows are
# written one whole line at a time under `RUN_DIR/data/regen/work/<split>/`, so rerunning this
# cell after any crash continues where it stopped. Watch it from a terminal with
# `draftlab monitor RUN_DIR/data/regen/work/train`.

# %%
config = rg.RegenConfig(
    model=SERVED_MODEL, temperature=TEMPERATURE, top_p=TOP_P, max_tokens=MAX_TOKENS, stop=STOP or None,
    seed=SEED if TEMPERATURE > 0 else None, system_policy=SYSTEM_POLICY, system_prompt=SYSTEM_PROMPT,
    truncation=TRUNCATION, max_assistant_turns=MAX_ASSISTANT_TURNS, concurrency=CONCURRENCY,
    request_timeout=REQUEST_TIMEOUT, max_retries=MAX_RETRIES,
)
out_dir = run.data("regen")
report = rg.regenerate_splits(inputs, out_dir, config, backend=BACKEND, base_urls=BASE_URLS, target=TARGET,
                              device=run.device, batch_size=BATCH_SIZE, batch_tokens=BATCH_TOKENS, limits=limits,
                              sglang_servers=SGLANG_SERVERS, sglang_prefix=SGLANG_PREFIX)
summary = pd.DataFrame({split: {k: v for k, v in s.items() if not isinstance(v, dict)}
                        for split, s in report["splits"].items()})
print(f"backend {report['backend']}, servers {report.get('servers')}, server start-up {report['server_startup_s']} s")
summary

# %% [markdown]
# ## 3 · Throughput over time

# %%
fig = monitor.plot_throughput(out_dir / "work" / SPLITS[0])
nb.save_figure(run, fig, "throughput")
print(monitor.format_summary(monitor.summarize(out_dir / "work" / SPLITS[0])))

# %% [markdown]
# ## 4 · Finish reasons and answer lengths before and after
# "length" means the answer hit MAX_TOKENS; with TRUNCATION = "drop" such rows are not in the
# training file, with "keep_flag" they are, marked `meta.regen.truncated`.

# %%
tokenizer = load_tokenizer(TARGET)
regen_rows = {split: rg.load_conversations(out_dir / f"{split}.jsonl") for split in SPLITS}
lengths = monitor.answer_lengths(source_rows, regen_rows, tokenizer)
finish = {split: monitor.finish_counts(out_dir / "work" / split) for split in SPLITS}
fig = monitor.plot_finish_and_lengths(finish, lengths, max_tokens=MAX_TOKENS)
nb.save_figure(run, fig, "finish_and_lengths")
pd.DataFrame({k: pd.Series(v).describe() for k, v in lengths.items()}).round(1)

# %% [markdown]
# ## 5 · A regenerated example

# %%
example = regen_rows[SPLITS[0]][0] if regen_rows[SPLITS[0]] else None
if example:
    for m in example["messages"]:
        print(f"[{m['role']}] {m['content'][:300]}")
    print(example["meta"]["regen"])

# %%
nb.save_metrics(run, {
    "backend": report["backend"],
    "server_startup_s": report["server_startup_s"],
    "config": {k: getattr(config, k) for k in rg.IDENTITY_FIELDS},
    "splits": {split: {k: s[k] for k in ("rows_total", "rows_done", "rows_dropped_truncated", "rows_kept_truncated",
                                         "rows_error", "completion_tokens", "tok_s", "wall_s", "finish_reasons",
                                         "retries")}
               for split, s in report["splits"].items()},
    "finish_reasons": finish,
    "answer_tokens_mean": {k: (sum(v) / len(v) if v else None) for k, v in lengths.items()},
})

# %% [markdown]
# ## Findings
# - Quick profile, measured on the development CPU (96 prompt-only coding prompts from the offline blend,
#   SmolLM2-135M-Instruct via `transformers serve --continuous-batching` on the 2-core CPU, 16
#   concurrent requests, max_tokens 48): 96/96 rows done, 0 errors, 0 retries; every answer ended
#   at `length` (these prompts ask for test files, far longer than 48 tokens), kept and flagged.
#   The machine was shared (load 8-10 on 2 cores), so it ran at 3-7 tok/s and took 22 min instead
#   of the ~3 min the same run needs at the ~30 tok/s this CPU serves when idle.
# - The CPU server finishes its concurrent requests together, so rows arrive in steps (figure
#   above); `draftlab monitor` and the progress bar average over minutes for that reason.
# - With short budgets the quick profile keeps truncated answers (`keep_flag`); the full profile
#   drops them (`drop`) and gives the target 768 tokens on the GPU batch backend.
