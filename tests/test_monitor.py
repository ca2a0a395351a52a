"""draftlab monitor: exact figures from a work folder written by hand, the CLI and the plot."""

import json

import pytest

from draftlab.cli import main as draftlab_main
from draftlab.regenerate import monitor
from helpers_regen import make_conversations, write_jsonl


def _row(conv, t_done, tokens, truncated=False):
    regen = {
        "t_done": t_done,
        "completion_tokens": tokens,
        "truncated": truncated,
        "finish_reasons": ["length" if truncated else "stop"] * len(tokens),
    }
    return {**conv, "meta": {"regen": regen}}


@pytest.fixture
def work(tmp_path):
    """20 rows in total; 12 done over 10 minutes (6 in the last 5), 2 dropped, 3 open errors."""
    now = 10_000.0
    rows = make_conversations(20)
    w = tmp_path / "work"
    (w / "shards").mkdir(parents=True)
    (w / "manifest.json").write_text(
        json.dumps({"total": 20, "runs": [{"started": now - 600, "backend": "server", "pid": None}]})
    )
    old = [_row(rows[i], now - 600 + 50 * i, [10]) for i in range(6)]  # t = now-600..now-350
    new = [_row(rows[6 + i], now - 240 + 40 * i, [20, 5], truncated=i == 0) for i in range(6)]
    write_jsonl(w / "shards" / "part-00000.jsonl", old)
    write_jsonl(w / "shards" / "part-00001.jsonl", new)
    with open(w / "shards" / "part-00001.jsonl", "ab") as fh:
        fh.write(b'{"id": "torn')  # a torn last line: ignored, never written back by the monitor
    write_jsonl(
        w / "dropped.jsonl",
        [
            {"id": rows[12]["id"], "reason": "length", "completion_tokens": [64], "t_done": now - 100},
            {"id": rows[13]["id"], "reason": "length", "completion_tokens": [64], "t_done": now - 700},
        ],
    )
    write_jsonl(
        w / "errors.jsonl",
        [
            {"id": rows[14]["id"], "reason": "turn 0: HTTP 500: boom [server x, attempt 6]"},
            {"id": rows[15]["id"], "reason": "turn 0: timeout after 5 s (ReadTimeout) [server x, attempt 6]"},
            {"id": rows[16]["id"], "reason": "turn 1: HTTP 500: boom [server x, attempt 6]"},
            {"id": rows[0]["id"], "reason": "turn 0: HTTP 500: old failure, done since"},
        ],
    )
    return w, now


def test_summary_figures(work):
    w, now = work
    s = monitor.summarize(w, window_s=300, now=now)
    assert s["total"] == 20 and s["kept"] == 12 and s["dropped_truncated"] == 2
    assert s["finished"] == 14 and s["left"] == 6 and s["errors_open"] == 3
    # last 5 minutes: the 6 new rows (25 tokens each) and one dropped row (64 tokens)
    assert s["rows_s"] == pytest.approx(7 / 300)
    assert s["tok_s"] == pytest.approx((6 * 25 + 64) / 300)
    assert s["eta_s"] == pytest.approx(6 / (7 / 300))
    # the run so far: every row finished since it started (not the one dropped at now - 700)
    assert s["tok_s_run"] == pytest.approx((6 * 10 + 6 * 25 + 64) / 560)
    assert s["error_rate"] == pytest.approx(3 / 17)
    assert s["truncation_rate"] == pytest.approx(3 / 14)  # 2 dropped + 1 kept flagged
    assert dict(s["top_errors"])["HTTP 500"] == 2
    assert (w / "shards" / "part-00001.jsonl").read_bytes().endswith(b'{"id": "torn')
    text = monitor.format_summary(s)
    assert "14/20 done" in text and "6 left" in text and "3 open" in text


def test_window_starts_at_the_current_run(work):
    w, now = work
    manifest = json.loads((w / "manifest.json").read_text())
    manifest["runs"].append({"started": now - 60, "backend": "server", "pid": None})
    (w / "manifest.json").write_text(json.dumps(manifest))
    s = monitor.summarize(w, window_s=300, now=now)
    # only rows finished since the current run began count: one, at now - 40
    assert s["window_s"] == pytest.approx(60)
    assert s["rows_s"] == pytest.approx(1 / 60)


def test_cli_prints_and_plots(work, capsys, tmp_path):
    w, _ = work
    assert draftlab_main(["monitor", str(w), "--plot", str(tmp_path / "tp.png")]) == 0
    out = capsys.readouterr().out
    # the fixture's rows finished in 1970: no ETA, but how long nothing has finished
    assert "rows" in out and "stalled for" in out and (tmp_path / "tp.png").stat().st_size > 1000
    assert draftlab_main(["monitor", str(w), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["finished"] == 14


def test_throughput_series_bins_tokens(work):
    w, now = work
    edges, tok_s, cum = monitor.throughput_series(w, bin_s=100)
    assert cum[-1] == 14 and len(edges) == len(tok_s) + 1
    widths = [b - a for a, b in zip(edges, edges[1:])]
    assert sum(r * w for r, w in zip(tok_s, widths)) == pytest.approx(6 * 10 + 6 * 25 + 2 * 64)
    assert all(w >= 100 for w in widths[:-1])


def test_throughput_of_a_server_that_finishes_in_waves_has_no_stalls(tmp_path):
    """A CPU server finishes its concurrent requests together: 8 rows every 30 s. Bins narrower than a wave
    read as spikes with zeros between them (issue 20.8); the rate over each wave is what it served."""
    rows = make_conversations(24)
    w = tmp_path / "work"
    (w / "shards").mkdir(parents=True)
    (w / "manifest.json").write_text(json.dumps({"total": 24, "runs": [{"started": 1000.0, "pid": None}]}))
    write_jsonl(w / "shards" / "part-00000.jsonl", [_row(rows[i], 1000.0 + 30 * (1 + i // 8), [15]) for i in range(24)])
    edges, tok_s, cum = monitor.throughput_series(w, bin_s=5)
    assert tok_s == pytest.approx([8 * 15 / 30] * 3) and min(tok_s) > 0
    assert edges == pytest.approx([0, 30, 60, 90]) and cum == [8, 16, 24]
    fig = monitor.plot_throughput(w, bin_s=5)
    assert "finished in each interval" in fig.axes[0].get_title()


def test_missing_manifest_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        monitor.summarize(tmp_path)


def test_answer_lengths_plot_says_when_there_is_nothing_before():
    """The offline blend holds prompts only: the before/after panel says "before: none" (issue 20.8)."""
    fig = monitor.plot_finish_and_lengths({"train": {"length": 3}}, {"before": [], "after": [5, 9, 16]}, 16)
    ax = fig.axes[1]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(t.startswith("before: none") for t in labels) and "no answers before" in ax.get_title()
    both = monitor.plot_finish_and_lengths({"train": {"stop": 2}}, {"before": [4, 8], "after": [5, 9]}, 16)
    assert both.axes[1].get_title() == "answer lengths before / after regeneration"


def test_garbage_line_mid_file_is_damage_not_complete(work, capsys):
    """A bad line before a shard's last one is not a torn tail: the monitor names file and line and
    exits 1 (a resume refuses that folder), instead of counting the shard as complete."""
    w, _ = work
    shard = w / "shards" / "part-00000.jsonl"
    lines = shard.read_text().splitlines(keepends=True)
    shard.write_text("".join(lines[:2] + ["{garbage\n"] + lines[2:]))
    s = monitor.summarize(w)
    assert s["damaged"] == [f"{shard}: line 3"]
    assert "damaged" in monitor.format_summary(s)
    assert draftlab_main(["monitor", str(w)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and f"{shard}: line 3" in err[0]


def test_duplicate_ids_are_reported(work):
    w, now = work
    first = json.loads((w / "shards" / "part-00000.jsonl").read_text().splitlines()[0])
    with open(w / "shards" / "part-00001.jsonl", "r+b") as fh:  # cut the torn tail, then a second copy
        data = fh.read()
        fh.seek(0)
        fh.truncate()
        fh.write(data[: data.rindex(b"\n") + 1] + (json.dumps(first) + "\n").encode())
    s = monitor.summarize(w, now=now)
    assert s["duplicates"] == [first["id"]]
    assert f"duplicates 1 ids finished more than once: {first['id']}" in monitor.format_summary(s)


def test_stalled_run_says_so_instead_of_a_growing_eta(work):
    w, now = work
    assert "ETA" in monitor.format_summary(monitor.summarize(w, now=now))  # the last row: 40 s ago
    later = monitor.summarize(w, now=now + 300)  # nothing since: 340 s, > 5 x the recent time per row
    text = monitor.format_summary(later)
    assert "stalled for 340 s" in text and "ETA" not in text


def test_throughput_axis_ignores_a_one_interval_spike_and_counts_capped_answers(tmp_path):
    """Steady 10 tok/s for 10 minutes, one interval of 3,000 tokens in one second mid-run and a short
    burst at the end: the axis follows the steady rate, the spike is marked, and the title says how
    many answers hit the token cap."""
    rows = make_conversations(64)
    w = tmp_path / "work"
    (w / "shards").mkdir(parents=True)
    (w / "manifest.json").write_text(json.dumps({"total": 64, "runs": [{"started": 0.0, "pid": None}]}))
    done = [_row(rows[i], 10.0 * (i + 1), [100], truncated=i % 4 == 0) for i in range(60)]
    done += [_row(rows[60], 301.0, [3000])]  # one second after the row before it, mid-run
    done += [_row(rows[61 + i], 600.5 + 0.1 * i, [100]) for i in range(3)]  # a burst at the very end
    write_jsonl(w / "shards" / "part-00000.jsonl", sorted(done, key=lambda r: r["meta"]["regen"]["t_done"]))
    edges, tok_s, _ = monitor.throughput_series(w, bin_s=1)
    assert edges[-1] - edges[-2] >= 0.5  # the end burst joined the interval before it
    fig = monitor.plot_throughput(w, bin_s=1)
    ax = fig.axes[0]
    assert max(tok_s) > 1000 and ax.get_ylim()[1] < 100  # the spike does not set the axis
    assert any("off the axis" in t.get_text() for t in ax.texts)
    assert "15 of 64 answers hit the token cap (finish_reason 'length')" in ax.get_title()
