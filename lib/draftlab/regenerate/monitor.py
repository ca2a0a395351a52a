"""`draftlab monitor DIR`: watch a regeneration from another terminal, from its files alone.

Reads a work folder of `draftlab.regenerate` (or `regen_batch`) without writing to it: rows
done and left, tokens/s over the last minutes, ETA, error and truncation rates, whether the
writer process is still alive, and "stalled" while the writer finds no server (its status.json);
`--plot` draws throughput over time.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path

from draftlab.core.errors import InputError
from draftlab.core.records import jsonl_lines
from draftlab.regenerate.client import reason_kind
from draftlab.regenerate.outputs import _read_lenient, read_manifest, read_status, shard_paths

EXAMPLE = "RUN/data/regen/work/train"


class NotAWorkFolder(InputError, FileNotFoundError):
    """The monitor was given a path that is not a regeneration work folder (says which one it wants)."""


def check_work_folder(work: Path) -> None:
    """A work folder has a manifest.json; otherwise say what to give, naming any found below."""
    if not work.exists():
        raise NotAWorkFolder(f"{work}: no such folder; give a regeneration work folder, e.g. {EXAMPLE}")
    if not work.is_dir():
        raise NotAWorkFolder(f"{work}: is a file; give a regeneration work folder, e.g. {EXAMPLE}")
    if (work / "manifest.json").exists():
        return
    below = sorted(str(p.parent) for pattern in ("*/manifest.json", "*/*/manifest.json") for p in work.glob(pattern))
    hint = f"the work folders under it: {', '.join(below[:4])}" if below else f"give one, e.g. {EXAMPLE}"
    raise NotAWorkFolder(f"{work}: not a regeneration work folder (no manifest.json); {hint}")


def _read(path: Path, damaged: list[str]) -> list[dict]:
    """The rows of a JSONL file, read only. A bad line before the last is damage (the writer never
    leaves one: a resume refuses the folder until it is fixed), noted in `damaged` as 'file: line N';
    a torn last line is a crash's normal trace and is redone on resume."""
    rows = []
    for line in jsonl_lines(path):
        if line.error is None and isinstance(line.row, dict):
            rows.append(line.row)
        elif not line.last:
            damaged.append(f"{path}: line {line.lineno}")
    return rows


def _events(work: Path) -> dict:
    """Finished-row events (t_done, completion tokens, truncated), open errors, damaged lines and
    ids finished more than once."""
    done, dropped, errors, damaged, seen = {}, {}, {}, [], Counter()
    for path in shard_paths(work):
        for row in _read(path, damaged):
            regen = (row.get("meta") or {}).get("regen") or {}
            seen[row.get("id")] += 1
            done[row.get("id")] = (
                regen.get("t_done", 0.0),
                sum(x or 0 for x in regen.get("completion_tokens", [])),
                bool(regen.get("truncated")),
            )
    if (work / "dropped.jsonl").exists():
        for rec in _read(work / "dropped.jsonl", damaged):
            seen[rec.get("id")] += 1
            dropped[rec.get("id")] = (
                rec.get("t_done", 0.0),
                sum(x or 0 for x in rec.get("completion_tokens", [])),
                True,
            )
    if (work / "errors.jsonl").exists():
        for rec in _read(work / "errors.jsonl", damaged):
            errors[rec.get("id")] = rec
    duplicates = sorted(str(k) for k, n in seen.items() if n > 1)
    return {"done": done, "dropped": dropped, "errors": errors, "damaged": damaged, "duplicates": duplicates}


def _pid_alive(pid) -> bool | None:
    if not pid:
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return None
    return True


def summarize(work: str | os.PathLike, window_s: float = 300.0, now: float | None = None) -> dict:
    """Where a regeneration stands; rates over the last `window_s` seconds (ending now)."""
    work = Path(work)
    check_work_folder(work)
    manifest = read_manifest(work)
    ev = _events(work)
    now = time.time() if now is None else now
    total = int(manifest.get("total", 0))
    finished = {**ev["done"], **ev["dropped"]}
    errors_open = {k: v for k, v in ev["errors"].items() if k not in finished}
    kept_truncated = sum(1 for v in ev["done"].values() if v[2])
    runs = manifest.get("runs") or [{}]
    last_start = runs[-1].get("started", now)
    # the window cannot reach back before the current run began (rows of an earlier run
    # finished before a crash would inflate the rate)
    start = max(now - window_s, last_start)
    span = max(now - start, 1e-9)
    recent = [v for v in finished.values() if v[0] >= start]
    rows_s = len(recent) / span
    tok_s = sum(v[1] for v in recent) / span
    left = max(total - len(finished), 0)
    times = [v[0] for v in finished.values() if v[0]]
    last_event = max([*times, last_start])
    return {
        "work": str(work),
        "backend": runs[-1].get("backend"),
        "total": total,
        "finished": len(finished),
        "kept": len(ev["done"]),
        "dropped_truncated": len(ev["dropped"]),
        "kept_truncated": kept_truncated,
        "errors_open": len(errors_open),
        "left": left,
        "window_s": round(span, 1),
        "rows_s": rows_s,
        "tok_s": tok_s,
        "eta_s": (left / rows_s) if rows_s > 0 and left else (0.0 if not left else None),
        "error_rate": len(errors_open) / max(len(finished) + len(errors_open), 1),
        "truncation_rate": (len(ev["dropped"]) + kept_truncated) / max(len(finished), 1),
        "completion_tokens": sum(v[1] for v in finished.values()),
        # the whole current run: from its start to its last finished row (or now if running)
        "tok_s_run": (
            sum(v[1] for v in finished.values() if v[0] >= last_start)
            / max((max(times) if times else now) - last_start, 1e-9)
        ),
        "first_done": min(times) if times else None,
        "last_done": max(times) if times else None,
        "runs": len(manifest.get("runs", [])),
        "writer_alive": _pid_alive(runs[-1].get("pid")),
        "top_errors": _top_reasons(errors_open),
        "damaged": ev["damaged"],
        "duplicates": ev["duplicates"],
        "idle_s": now - last_event,  # since the last finished row (or the run's start)
        **_writer_status(work, runs[-1].get("pid"), now),
    }


def _writer_status(work: Path, pid, now: float) -> dict:
    """The current writer's status.json: state and, while stalled, seconds without a server."""
    status = read_status(work)
    if not status or status.get("pid") != pid:
        return {"state": None, "stalled_s": None, "status_message": None}
    stalled = now - status["since"] if status.get("state") == "stalled" and status.get("since") else None
    return {
        "state": status.get("state"),
        "stalled_s": stalled,
        "status_message": status.get("message"),
        "max_outage": status.get("max_outage"),
    }


def _top_reasons(errors: dict, n: int = 3) -> list[tuple[str, int]]:
    from collections import Counter

    return Counter(reason_kind(r.get("reason", "?")) for r in errors.values()).most_common(n)


def _hms(seconds) -> str:
    if seconds is None:
        return "unknown"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def format_summary(s: dict) -> str:
    pct = 100.0 * s["finished"] / max(s["total"], 1)
    alive = {True: "running", False: "not running", None: "unknown"}[s["writer_alive"]]
    lines = [
        f"{s['work']}  ({s['backend']} backend, run {s['runs']}, writer {alive})",
        f"rows      {s['finished']}/{s['total']} done ({pct:.1f}%), {s['left']} left"
        f"  [kept {s['kept']}, dropped as truncated {s['dropped_truncated']}]",
        f"speed     {s['tok_s']:.1f} tok/s, {s['rows_s'] * 60:.1f} rows/min over the last {s['window_s'] / 60:.1f} min",
        f"          {s['tok_s_run']:.1f} tok/s over the current run (start to last row)",
        _eta_line(s),
        f"errors    {s['errors_open']} open ({100 * s['error_rate']:.2f}%)"
        + (f"  top: {', '.join(f'{k} x{v}' for k, v in s['top_errors'])}" if s["top_errors"] else ""),
        f"truncated {s['dropped_truncated'] + s['kept_truncated']} ({100 * s['truncation_rate']:.2f}%)"
        f"  [dropped {s['dropped_truncated']}, kept+flagged {s['kept_truncated']}]",
    ]
    if s.get("duplicates"):
        ids = ", ".join(s["duplicates"][:5]) + (" ..." if len(s["duplicates"]) > 5 else "")
        lines.append(f"duplicates {len(s['duplicates'])} ids finished more than once: {ids}")
    if s.get("damaged"):
        more = f" and {len(s['damaged']) - 3} more" if len(s["damaged"]) > 3 else ""
        lines.append(
            f"damaged   {'; '.join(s['damaged'][:3])}{more}: not valid JSON mid-file, so not complete "
            "(a resume refuses the folder until the line is removed)"
        )
    return "\n".join(lines)


# no row finished for this long, and for this many times the recent time per row: stalled, not slow
STALL_MIN_S = 60.0
STALL_FACTOR = 5.0


def _eta_line(s: dict) -> str:
    """ETA, or instead why there is none: the writer finds no server, or it stopped for that."""
    if s.get("state") == "stalled" and s.get("writer_alive") is not False and s.get("stalled_s") is not None:
        limit = f" (it stops after {s['max_outage']:.0f} s)" if s.get("max_outage") is not None else ""
        return f"stalled: no server for {s['stalled_s']:.0f} s{limit}: {s.get('status_message') or ''}".rstrip(": ")
    if s.get("state") == "stopped" and s.get("left"):
        return f"stopped   {s.get('status_message') or 'the writer stopped'}"
    if s.get("left") and s.get("writer_alive") is False:
        return "stopped   the writer is not running: rerun the same command to resume"
    if s.get("left") and is_stalled(s):
        return f"stalled for {s['idle_s']:.0f} s: no row finished since (the writer is {s.get('state') or 'running'})"
    return f"ETA       {_hms(s['eta_s'])}"


def is_stalled(s: dict) -> bool:
    """No row for a minute or more, and for five times the recent time per row: an ETA would only grow."""
    per_row = 1 / s["rows_s"] if s.get("rows_s") else 0.0
    return s.get("idle_s", 0.0) >= max(STALL_MIN_S, STALL_FACTOR * per_row)


def throughput_series(work: str | os.PathLike, bin_s: float | None = None):
    """(interval starts in seconds since the first run began, output tokens/s over each interval,
    rows finished by its end). Each interval ends at a finished row and lasts at least `bin_s`
    (default: a twelfth of the span, at least 5 s), so tokens are spread over the time in which they
    were generated: a server that finishes its concurrent requests together (a CPU server, a batch
    backend's chunks) reads as its real rate, not as spikes with stalls at zero between them."""
    work = Path(work)
    ev = _events(work)
    items = sorted(v for v in {**ev["done"], **ev["dropped"]}.values() if v[0])
    if not items:
        return [], [], []
    t0, t1 = items[0][0], items[-1][0]
    try:
        runs = json.loads((work / "manifest.json").read_text()).get("runs") or []
        t0 = min([t0] + [r["started"] for r in runs if r.get("started")])
    except (OSError, ValueError):
        pass
    if bin_s is None:
        bin_s = max(5.0, (t1 - t0) / 12)
    edges, toks, cum = [t0], [], []  # interval edges, tokens in each, rows finished by each end
    tokens, rows = 0.0, 0
    for k, (t, tok, _) in enumerate(items):
        tokens += tok
        rows += 1
        last = k == len(items) - 1
        if last or (t - edges[-1] >= bin_s and items[k + 1][0] > t):  # never split rows finished together
            if last and toks and t - edges[-1] < bin_s / 2:  # a short tail joins the interval before it:
                edges.pop()  # alone, a few rows over a second or two read as a spike
                tokens += toks.pop()
                cum.pop()
            edges.append(max(t, edges[-1] + 1e-9))
            toks.append(tokens)
            cum.append(rows)
            tokens = 0.0
    rates = [n / (b - a) for n, a, b in zip(toks, edges, edges[1:])]
    return [e - t0 for e in edges], rates, cum


def axis_top(rates: list[float]) -> tuple[float, bool]:
    """The y-axis top: the highest rate, unless one interval is far above the rest (over 1.5 times
    their 90th percentile); then that bound, and True: the clipped bars are marked on the figure."""
    if len(rates) < 3:
        return max(rates or [1.0]) * 1.1 or 1.0, False
    ranked = sorted(rates)
    bound = 1.5 * ranked[int(0.9 * (len(ranked) - 1))]
    return (bound, True) if ranked[-1] > bound > 0 else (ranked[-1] * 1.1 or 1.0, False)


def plot_throughput(work: str | os.PathLike, bin_s: float | None = None, ax=None):
    """Figure: output tokens/s over each interval between finished rows, with finished rows on a second axis."""
    import matplotlib.pyplot as plt

    edges, tok_s, cum = throughput_series(work, bin_s)
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 3.5))
    else:
        fig = ax.figure
    mins = [x / 60 for x in edges]
    ax.stairs(tok_s, mins, color="tab:blue", label="output tok/s", fill=True, alpha=0.35)
    top, clipped = axis_top(tok_s)
    ax.set_ylim(0, top)
    for rate, a, b in zip(tok_s, mins, mins[1:]):
        if clipped and rate > top:
            ax.annotate(f"{rate:,.0f} tok/s\n(off the axis)", ((a + b) / 2, top), ha="center", va="top", fontsize=8)
    ax.set_xlabel("minutes since the run began")
    ax.set_ylabel("output tokens/s", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(mins, [0] + cum if tok_s else [], color="tab:orange", marker=".", label="rows finished")
    ax2.set_ylabel("rows finished", color="tab:orange")
    ax2.set_ylim(bottom=0)
    finish = finish_counts(work)
    capped, answers = finish.get("length", 0), sum(finish.values())
    ax.set_title(
        f"regeneration throughput: {Path(work).name}\n(tokens of the rows finished in each interval, over its "
        f"length)\n{capped} of {answers} answers hit the token cap (finish_reason 'length')",
        fontsize=10,
        color="tab:red" if capped else "black",
    )
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ notebook 03 report figures


def answer_lengths(source_rows: dict, regen_rows: dict, tokenizer) -> dict:
    """Token counts of assistant answers before (the dataset's, by `tokenizer`) and after
    regeneration (the server's `completion_tokens`)."""

    def count(rows):
        texts = [m["content"] for r in rows for m in r["messages"] if m["role"] == "assistant" and m["content"]]
        if not texts:
            return []
        return [len(ids) for ids in tokenizer(texts, add_special_tokens=False).input_ids]

    def served(rows):  # the server's own token counts where recorded
        out = []
        for r in rows:
            regen = (r.get("meta") or {}).get("regen")
            if regen and all(c is not None for c in regen.get("completion_tokens", [None])):
                out += regen["completion_tokens"]
            else:
                out += count([r])
        return out

    return {
        "before": count([r for rows in source_rows.values() for r in rows]),
        "after": served([r for rows in regen_rows.values() for r in rows]),
    }


def finish_counts(work: str | os.PathLike) -> dict:
    """Finish reasons of every regenerated turn in a work folder (kept and dropped rows)."""
    from collections import Counter

    work, counts = Path(work), Counter()
    for path in shard_paths(work):
        for row in _read_lenient(path):
            counts.update(((row.get("meta") or {}).get("regen") or {}).get("finish_reasons", []))
    if (work / "dropped.jsonl").exists():
        for rec in _read_lenient(work / "dropped.jsonl"):
            counts.update(rec.get("finish_reasons", ["length"]))
    return dict(counts)


def plot_finish_and_lengths(finish: dict, lengths: dict, max_tokens: int | None = None):
    """Two panels: finish reasons per split ({split: {reason: n}}); answer lengths before/after."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    splits = list(finish)
    reasons = sorted({r for s in finish.values() for r in s})
    width = 0.8 / max(len(reasons), 1)
    for k, reason in enumerate(reasons):
        vals = [finish[s].get(reason, 0) for s in splits]
        ax1.bar([i + k * width for i in range(len(splits))], vals, width, label=reason)
    ax1.set_xticks([i + 0.4 - width / 2 for i in range(len(splits))], splits)
    ax1.set_ylabel("answers (turns)")
    ax1.set_title("finish reasons")
    ax1.legend()
    top = max([*lengths["before"], *lengths["after"], 1])
    bins = list(range(0, top + max(top // 30, 1) + 1, max(top // 30, 1)))
    for key, color in (("before", "tab:gray"), ("after", "tab:blue")):
        if lengths[key]:
            ax2.hist(lengths[key], bins=bins, alpha=0.55, color=color, label=f"{key} (n={len(lengths[key])})")
    if not lengths["before"]:  # a prompt-only blend (the offline docstring one): nothing to compare with
        ax2.plot([], [], " ", label="before: none (the blend's rows\nare prompts without answers)")
    if max_tokens:
        ax2.axvline(max_tokens, color="tab:red", ls="--", lw=1, label=f"max_tokens {max_tokens}")
    ax2.set_xlabel("answer length (target tokens)")
    ax2.set_ylabel("answers")
    ax2.set_title(
        "answer lengths before / after regeneration"
        if lengths["before"]
        else "answer lengths after regeneration (no answers before)"
    )
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return fig
