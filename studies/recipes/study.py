"""The recipe study: one change per row against the reference recipe, each row's draft
trained on the same regenerated set and measured the same way in SGLang.

Why: going from 2 to 5 epochs alone took acceptance from 2.12 to 2.92, so which lever is worth its
GPU time is an empirical question. A row is a set of TrainConfig overrides; `train_rows` runs
`draftlab train --resume --export` for each (several at once on one GPU; SIGTERM/SIGINT checkpoints them and the
next run resumes them); `measure_rows` starts one SGLang server per draft
(chain S, plus SGLang's plain baseline) and sends every server the same held-out and HumanEval
prompt ids (draftlab.benchmark_acceptance.sglang_live); `table` joins both into one row each.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd

from draftlab.benchmark_acceptance.live import load_eval_set, server_tokens_per_s
from draftlab.benchmark_acceptance.sglang_live import Entry, measure, read_windows, slug
from draftlab.benchmark_acceptance.sglang_study import NCCL_PORT_OFFSET, study_entries, study_server_flags
from draftlab.core.acceptance import acceptance_length
from draftlab.core.errors import InputError
from draftlab.core.files import atomic_write_json
from draftlab.core.paths import repo_relative
from draftlab.core.process import start_owned, stop_tree
from draftlab.core.records import read_jsonl
from draftlab.core.stop import graceful_stop
from draftlab.train_draft import (
    TrainConfig,
    child_env,
    cli_args,
    precompute_first,
    tokenize_first,
)
from studies.recipes.figures import plot, plot_by_steps
from studies.recipes.rows import EXTRA_ROWS, ROWS, recipe, row_train_file


def row_config(row: str, train_file: str, val_file: str, out: Path, target: str, extra: dict) -> TrainConfig:
    """One row's TrainConfig: its recipe, training into OUT/<row>/train, with what every row shares in OUT."""
    return TrainConfig.from_dict(
        {
            **recipe(row),
            "train_file": row_train_file(row, train_file),
            "val_file": val_file,
            "out_dir": str(out / row / "train"),
            "target": target,
            **shared(out),
            **extra,
        }
    )


def shared(out: Path) -> dict:
    """What the study's runs share: the tokens (OUT/tokens) and, with `hidden offline`, the target's
    states (OUT/hidden), both made once by the parent (tokenize_first, precompute_first)."""
    return {"token_cache": str(out / "tokens"), "hidden_dir": str(out / "hidden")}


def train_command(row: str, cfg: TrainConfig, out: Path) -> list[str]:
    """`draftlab train` for one row, resumable and exporting its draft to OUT/<row>/draft at the end."""
    return [
        sys.executable,
        "-m",
        "draftlab.cli",
        "train",
        *cli_args(cfg, resume=True),
        "--export",
        str(out / row / "draft"),
    ]


def trained(out: Path, row: str) -> bool:
    return (out / row / "draft" / "model.safetensors").is_file() and (out / row / "train" / "summary.json").is_file()


def train_summary(out: Path, row: str) -> dict | None:
    """A row's OUT/<row>/train/summary.json (None before its training wrote one)."""
    path = out / row / "train" / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else None


def training_state(out: Path, row: str) -> str:
    """How far a row's training got, for an error that says what to do next."""
    done = train_summary(out, row)
    if done is None:
        return "not trained"
    return f"cut at step {done['steps']:,} of {done['total_steps']:,}" if not done["finished"] else "no draft exported"


# a stopped `draftlab train` exits 128 + the signal (core.stop) after saving its checkpoint
STOPPED_EXITS = (128 + signal.SIGTERM, 128 + signal.SIGINT)


def row_status(out: Path, row: str, rc: int) -> str:
    """done; cut (stopped by a signal after its checkpoint: the next run resumes it); failed."""
    if rc == 0 and trained(out, row):
        return "done"
    if rc in STOPPED_EXITS or rc < 0:
        return "cut"
    return f"failed (exit {rc})"


def run_row(argv: list[str], stop, **popen_kwargs) -> int:
    """A row's `draftlab train` to its end: its exit code. A stop request is passed on as one SIGTERM
    (the row checkpoints and exits), since the child runs in a process group of its own."""
    proc = start_owned(argv, **popen_kwargs)
    told = False
    try:
        while True:
            try:
                return proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                if stop and not told:
                    proc.send_signal(signal.SIGTERM)
                    told = True
    except BaseException:  # a second signal: leave nothing behind
        stop_tree(proc, grace=1.0)
        raise


def train_rows(
    rows: list[str],
    train_file: str,
    val_file: str,
    out: Path,
    *,
    target: str = "embedded",
    parallel: int = 1,
    extra: dict | None = None,
) -> dict[str, str]:
    """Train the rows not trained yet, `parallel` at a time, each to its end. SIGTERM/SIGINT stops them
    cleanly (each checkpoints; the status is written) and raises core.stop.Stopped; the next run resumes
    the cut rows from their checkpoints.
    Returns {row: "done" | "cut" | "failed (exit N)"}; logs in OUT/<row>/train.log. What the rows share
    (shared: the tokens, offline target states) is made here first, so that rows started together only read it."""
    cfgs = {row: row_config(row, train_file, val_file, out, target, extra or {}) for row in rows}  # unknown: fail now
    todo = [r for r in rows if not trained(out, r)]
    status = {r: "done" for r in rows if r not in todo}
    for r in todo:
        if not Path(cfgs[r].train_file).is_file():
            raise InputError(
                f"recipe row {r}: its train file {cfgs[r].train_file} is missing"
                + (" (grown by `recipes grow` from its regenerated sets)" if r in EXTRA_ROWS else "")
            )  # before any row starts
    with graceful_stop("run the same `python -m studies.recipes train` again to resume the cut rows") as stop:
        if todo:
            tokenize_first([cfgs[r] for r in todo])
            precompute_first([cfgs[r] for r in todo])
        env = child_env(max(1, parallel))  # each child's CPU threads: a share of the cores

        def one(row: str) -> str:
            (out / row).mkdir(parents=True, exist_ok=True)
            if stop:
                return "cut"  # not started: the stop came first
            with open(out / row / "train.log", "a") as log:
                rc = run_row(train_command(row, cfgs[row], out), stop, stdout=log, stderr=log, env=env)
            return row_status(out, row, rc)

        with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
            for row, result in zip(todo, pool.map(one, todo)):
                status[row] = result
                print(f"recipe row {row}: {result}", flush=True)
        atomic_write_json(out / "train_status.json", status, indent=1)
        if stop:
            stop.stopped(f"recipe rows {', '.join(r for r in todo if status[r] != 'done')} cut")
    return status


def prompt_sets(
    held_out: str, samples: int, humaneval: int, multi_turn: str | None = None, multi_turn_samples: int = 0
) -> tuple[list[dict], dict[str, range]]:
    """The held-out split's first `samples` prompts, then HumanEval's first `humaneval`, then the first
    `multi_turn_samples` of the multi-turn held-out file (volume.multi_turn_held_out): (prompts, index ranges)."""
    prompts = load_eval_set(held_out, None, samples)
    if len(prompts) < samples:
        raise InputError(f"{held_out}: {len(prompts)} prompts, fewer than {samples}")
    parts = {"held_out": prompts, "humaneval": load_eval_set("humaneval", None, humaneval) if humaneval else []}
    if multi_turn_samples:
        if not multi_turn:
            raise InputError(f"{multi_turn_samples} multi-turn prompts asked for, but no multi-turn file given")
        parts["multi_turn"] = load_eval_set(str(multi_turn), None, multi_turn_samples)
        if len(parts["multi_turn"]) < multi_turn_samples:
            raise InputError(f"{multi_turn}: {len(parts['multi_turn'])} prompts, fewer than {multi_turn_samples}")
    sets, start = {}, 0
    for name, part in parts.items():
        sets[name], start = range(start, start + len(part)), start + len(part)
    return [p for part in parts.values() for p in part], sets


def row_entries(
    rows: list[str],
    out: Path,
    model_path: str,
    *,
    steps: int,
    concurrency: list[int],
    port: int,
    chain: list[int] | None = None,
    chain_rows: list[str] | None = None,
    max_running_requests: int = 64,
    mem_fraction_static: float = 0.9,
    max_total_tokens: int = 65536,
    server_flags: tuple[str, ...] = (),
) -> list[Entry]:
    """SGLang's plain baseline once, then for each row's draft one server per chain length S of `chain`
    (default: `steps` alone; only for the rows of `chain_rows` when given), each on ports of its own. The
    server at `steps` is labelled with the row and measured at every concurrency; the others, '<row> S<s>',
    at the first concurrency only (their acceptance and speed, from the same kind of window as the main
    server's). `server_flags` go to every server (bench sglang --server-flags)."""
    extra = study_server_flags(mem_fraction_static, max_total_tokens, server_flags)
    more = sorted(set(chain or []) - {steps})  # the main server first: the baseline comes with it
    servers = [(row, s) for row in rows for s in [steps] + (more if chain_rows is None or row in chain_rows else [])]
    if 2 * len(servers) >= NCCL_PORT_OFFSET:
        raise InputError(f"{len(servers)} draft servers: too many for the port plan")
    entries = []
    for k, (row, s) in enumerate(servers):
        # two ports a server (study_entries' baseline and chain; NCCL on those + NCCL_PORT_OFFSET)
        base, server = study_entries(
            model_path,
            str(out / row / "draft"),
            chain=[s],
            main_steps=s,
            trees=[],
            concurrency=list(concurrency) if s == steps else list(concurrency[:1]),
            wrong_flag=False,
            max_running_requests=max_running_requests,
            port=port + 2 * k,
            extra=extra,
        )
        if k == 0:
            entries.append(base)
        server.label = row if s == steps else f"{row} S{s}"
        entries.append(server)
    return entries


# acceptance per prompt from the replies of the first (every server has that window; 16: ~1.5 s for 96
# prompts), and batch 1 for the speedup goal (the baseline and each row's main server)
MEASURED_CONCURRENCY = (16, 1)


def measure_rows(
    rows: list[str],
    out: Path,
    model_path: str,
    prompt_ids: list[list[int]],
    sets: dict[str, range],
    *,
    steps: int = 6,
    chain: list[int] | None = None,
    chain_rows: list[str] | None = None,
    concurrency=MEASURED_CONCURRENCY,
    env: dict | None = None,
    port: int = 32000,
    repeats: int = 3,
    server_flags: tuple[str, ...] = (),
) -> list[str]:
    """Every row's draft (each must be trained) and the baseline in SGLang on the same prompt ids, at chain S = `steps`
    and each S of `chain` (for the rows of `chain_rows`; None: all); OUT/sglang/. Per concurrency one
    unmeasured window, then `repeats` rounds of one measured window over every prompt on every server in turn
    (the table takes their median tok/s: one batch-1 window of a server varied +-20%); acceptance per prompt
    comes from the first concurrency's replies (their meta_info)."""
    for r in rows:  # a row left out quietly would cost a whole measuring call (2026-12-03: 454 s of base alone)
        if not trained(out, r):
            raise InputError(
                f"recipe row {r}: no trained draft in {out / r} ({training_state(out, r)}); "
                "train it to the end first (python -m studies.recipes train), or leave it out of --rows"
            )
    if stray := sorted(set(chain_rows or ()) - set(rows)):
        raise InputError(f"recipes measure: --chain-rows {','.join(stray)} not among --rows {','.join(rows)}")
    entries = row_entries(
        rows,
        out,
        model_path,
        steps=steps,
        concurrency=concurrency,
        port=port,
        chain=chain,
        chain_rows=chain_rows,
        server_flags=server_flags,
    )
    sglang = out / "sglang"
    sglang.mkdir(parents=True, exist_ok=True)
    atomic_write_json(
        sglang / "plan.json",
        {
            "steps": steps,
            "concurrency": list(concurrency),
            "prompt_ids": prompt_ids,
            "sets": {k: [v.start, v.stop] for k, v in sets.items()},
            "entries": [e.__dict__ for e in entries],
        },
        indent=1,
    )
    return measure(entries, prompt_ids, sglang, repeats=repeats, warmup=1, env=env, samples=len(prompt_ids))


def served(replies: list[dict], indices: range) -> tuple[list[int], list[int]]:
    """(completion tokens, verify steps) per reply to these prompts, those with speculative counts."""
    picked = [r for r in replies if r["index"] in indices and r.get("spec_verify_ct")]
    return [r["completion_tokens"] for r in picked], [r["spec_verify_ct"] for r in picked]


def replies_of(sglang: Path, label: str) -> list[dict]:
    """A server's replies in a study's SGLang folder (none measured yet: [])."""
    outputs = sglang / "outputs" / f"{slug(label)}.jsonl"
    return list(read_jsonl(outputs)) if outputs.is_file() else []


def acceptance_by_steps(out: Path) -> pd.DataFrame:
    """One line per (row, chain S, prompt set): SGLang's acceptance from every server of the study."""
    plan = json.loads((out / "sglang" / "plan.json").read_text())
    sets = {k: range(*v) for k, v in plan["sets"].items()}
    lines = []
    for e in (e for e in plan["entries"] if e["algorithm"]):
        replies = replies_of(out / "sglang", e["label"])
        for name, idx in sets.items():
            lines.append(
                {
                    "row": e["label"].split(" S")[0],
                    "steps": e["steps"],
                    "set": name,
                    "acceptance": acceptance_length(*served(replies, idx)),
                }
            )
    df = pd.DataFrame(lines, columns=["row", "steps", "set", "acceptance"])
    order = {row: k for k, row in enumerate(dict.fromkeys(df["row"]))}
    return df.sort_values(
        ["row", "steps", "set"], key=lambda c: c.map(order) if c.name == "row" else c, ignore_index=True
    )


def speed_by_steps(out: Path) -> pd.DataFrame:
    """One line per (row, chain S): SGLang's tok/s at the study's first concurrency (every server has that
    window) and the speedup over the plain baseline's in the same run: which S pays at that batch size."""
    sglang = out / "sglang"
    plan = json.loads((sglang / "plan.json").read_text())
    first = int(_levels(plan)[0])
    tok_s = _measured_tok_s(sglang)
    base = tok_s.get(("baseline", first))
    lines = [
        {
            "row": e["label"].split(" S")[0],
            "steps": e["steps"],
            "concurrency": first,
            "tok_s": tok_s.get((e["label"], first)),
            "speedup": tok_s[(e["label"], first)] / base if base and (e["label"], first) in tok_s else None,
        }
        for e in plan["entries"]
        if e["algorithm"]
    ]
    return pd.DataFrame(lines, columns=["row", "steps", "concurrency", "tok_s", "speedup"])


def _levels(plan: dict) -> list[int]:
    """The concurrencies a study measured (a study measured at one stored it as an int: 2026-12-01)."""
    levels = plan.get("concurrency", [])
    return [levels] if isinstance(levels, int) else levels


def _measured_windows(sglang: Path) -> list[dict]:
    """A study's measured windows (none yet: [])."""
    return read_windows(sglang) if (sglang / "windows.jsonl").is_file() else []


def _measured_tok_s(sglang: Path) -> dict[tuple[str, int], float]:
    """(label, concurrency) -> median tok/s of a study's measured windows (none yet: {})."""
    return _tok_s(_measured_windows(sglang))


def _tok_s(windows: list[dict], server: bool = False) -> dict[tuple[str, int], float]:
    """(label, concurrency) -> the median tok/s of its measured windows: over the client's wall, or with
    `server` over the server's own seconds (server_s, the replies' e2e_latency summed; windows without it,
    those before 2026-12-04, are left out)."""
    by = {}
    for w in windows:
        rate = server_tokens_per_s(w) if server else w["tokens_per_s"]
        if rate is None:
            continue  # no server seconds in this window
        by.setdefault((w["label"], int(w.get("concurrency") or 0)), []).append(rate)
    return {k: float(pd.Series(v).median()) for k, v in by.items()}


def table(out: Path) -> pd.DataFrame:
    """One line per row: the change, SGLang acceptance per prompt set, tok/s and the speedup over SGLang's
    own baseline per concurrency, training minutes and rate, and the validation's simulated acceptance
    (from the row's own training summary)."""
    sglang = out / "sglang"
    plan = json.loads((sglang / "plan.json").read_text())
    sets = {k: range(*v) for k, v in plan["sets"].items()}
    levels = _levels(plan)
    windows = _measured_windows(sglang)
    tok_s, server_tok_s = _tok_s(windows), _tok_s(windows, server=True)
    lines = []
    for row in [e["label"] for e in plan["entries"] if e["algorithm"] and e["label"] in ROWS]:  # the main servers
        overrides, why = ROWS[row]
        line = {
            "row": row,
            "change": json.dumps(overrides) if overrides else "-",
            "question": why,
            # acceptance comes from the first level's replies, and it moves with the batch: base measured
            # 3.17 at 16 and 3.06 at 1 (2026-12-02), so a table says which
            "acceptance_concurrency": levels[0] if levels else None,
        }
        replies = replies_of(sglang, row)
        for name, idx in sets.items():
            line[f"sglang_acceptance_{name}"] = acceptance_length(*served(replies, idx))
        for c in levels:
            line[f"sglang_tok_s_c{c}"] = tok_s.get((row, c))
            base = tok_s.get(("baseline", c))
            line[f"sglang_speedup_c{c}"] = tok_s[(row, c)] / base if base and (row, c) in tok_s else None
        # batch 1 once more over the server's own seconds: the speedup without the client's HTTP round trips
        # (at higher batches the requests overlap and their latencies do not add up to a time)
        if (row, 1) in server_tok_s and ("baseline", 1) in server_tok_s:
            line["sglang_server_speedup_c1"] = server_tok_s[(row, 1)] / server_tok_s[("baseline", 1)]
        s = train_summary(out, row)
        if s is not None:
            # the rate over every call (summaries from before 2026-12-02 have only the last call's)
            line.update(
                {
                    "train_minutes": s["elapsed_total_s"] / 60,
                    "train_tok_s": s.get("tokens_per_s_all_calls") or s["tokens_per_s"],
                    "val_sim_acceptance": (s.get("eval") or {}).get("sim_accept_len"),
                    "val_acc_0": (s.get("eval") or {}).get("acc_0"),
                }
            )
        lines.append(line)
    return pd.DataFrame(lines)


def combined_table(studies: list[Path]) -> pd.DataFrame:
    """Every study folder's table in one (a study per device session), each line with its study and its gain
    over the `base` row that the same study measured (the same servers and windows): the comparison that holds
    across sessions, whose absolute tok/s differ. A row measured by several studies keeps the last one's; a
    later study that only planned it (cut at its deadline: no replies) does not replace a measurement."""
    tables = []
    for study in studies:
        df = table(study)
        if df.empty or "base" not in set(df["row"]):
            raise InputError(f"{study}: no measured base row to compare against (python -m studies.recipes measure)")
        base = df.loc[df["row"] == "base"].iloc[0]
        for name in ("held_out", "humaneval"):
            df[f"gain_{name}"] = df[f"sglang_acceptance_{name}"] / base[f"sglang_acceptance_{name}"]
        tables.append(df.assign(study=repo_relative(study)))
    both = pd.concat(tables, ignore_index=True)
    measured = both["sglang_acceptance_held_out"].notna()
    both = pd.concat([both[~measured], both[measured]], ignore_index=True)  # each group keeps the studies' order
    return both.drop_duplicates("row", keep="last").reset_index(drop=True)


def write_combined(studies: list[Path], out: Path) -> pd.DataFrame:
    """OUT/table.csv and OUT/recipes.png across the study folders (combined_table), rows in ROWS order."""
    df = combined_table(studies)
    first = ["row", "change", "question", "study", "gain_held_out", "gain_humaneval"]
    df = df[first + [c for c in df.columns if c not in first]]
    df = df.sort_values("row", key=lambda c: c.map(list(ROWS).index), ignore_index=True)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "table.csv", index=False)
    plot(df, out / "recipes.png")
    return df


def write_report(out: Path) -> pd.DataFrame:
    """OUT/table.csv and OUT/recipes.png from what OUT holds so far; with more than one chain length,
    OUT/acceptance_by_steps.csv, OUT/speed_by_steps.csv and OUT/recipes_by_steps.png too."""
    df = table(out)
    df.to_csv(out / "table.csv", index=False)
    if not df.empty:
        plot(df, out / "recipes.png", json.loads((out / "sglang" / "plan.json").read_text())["steps"])
    by_steps = acceptance_by_steps(out)
    if by_steps["steps"].nunique() > 1:
        speed = speed_by_steps(out)
        by_steps.to_csv(out / "acceptance_by_steps.csv", index=False)
        speed.to_csv(out / "speed_by_steps.csv", index=False)
        plot_by_steps(by_steps, speed, out / "recipes_by_steps.png")
    return df
