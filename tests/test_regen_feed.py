"""The regeneration client keeps its requests in flight (issue 17.6: a median of 24 running requests
at --concurrency 1024 starved an SGLang server). The server here is a fake with unlimited batch in
its own process (helpers_regen/fake_openai.py), so whatever falls short is the client's.
Both tests fail with the client's old single httpx pool (figures: LOG.md 2026-12-01)."""

import time

import pytest

from draftlab.regenerate import RegenConfig, regenerate
from draftlab.regenerate.bench import bench_prompts
from helpers_regen.fake_openai import FakeOpenAIProcess

pytestmark = pytest.mark.server


def _run(work, rows: int, concurrency: int, delay: float, jitter: float = 0.0) -> tuple[dict, float]:
    """One regeneration against a fresh fake: its in-flight counts and the client's CPU s per row."""
    config = RegenConfig(model="fake", max_tokens=256, concurrency=concurrency, truncation="keep_flag")
    with FakeOpenAIProcess(delay=delay, jitter=jitter) as srv:
        cpu = time.process_time()
        summary = regenerate(bench_prompts(rows), work, [srv.base_url], config, progress=False)
        cpu = time.process_time() - cpu
        stats = srv.stats()
    assert summary["rows_done"] == rows and summary["rows_error"] == 0, summary
    return stats, cpu / rows


@pytest.fixture(scope="module")
def high(tmp_path_factory):
    """1,024 rows in flight for 1-3 s each: two rounds of rows."""
    return _run(tmp_path_factory.mktemp("feed") / "w", rows=2048, concurrency=1024, delay=2.0, jitter=0.5)


def test_client_keeps_its_requests_in_flight(high):
    stats, _ = high
    print(stats)
    assert stats["peak_in_flight"] == 1024, stats
    # between the old single pool's mean and the split pools' on the loaded 2-core machine (LOG.md)
    assert stats["mean_in_flight"] >= 384, stats


def test_client_cpu_per_row_does_not_grow_with_concurrency(high, tmp_path):
    """What starved the server: one httpx pool of C connections costs O(C) CPU per request."""
    _, low = _run(tmp_path / "low", rows=512, concurrency=16, delay=0.05)
    _, cpu_high = high
    print(f"client CPU per row: {1e3 * low:.2f} ms at concurrency 16, {1e3 * cpu_high:.2f} ms at 1024")
    # O(C) CPU a row would make it ~64x (C: 16 -> 1024); 2x was crossed by noise once (0.96 vs 1.94 ms, 2026-12-02)
    assert cpu_high < 3.0 * low, (low, cpu_high)
