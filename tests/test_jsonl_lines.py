"""core.records.jsonl_lines: the one JSONL parse loop. Its `last` flag (only blanks follow) decides
whether a bad line is a torn tail, and reading must stay linear in the file's size."""

import time

from draftlab.core.records import jsonl_lines


def _lines(tmp_path, data: bytes):
    path = tmp_path / "x.jsonl"
    path.write_bytes(data)
    return [(x.lineno, x.row, x.error is not None, x.last, x.terminated) for x in jsonl_lines(path)]


def test_last_means_only_blanks_follow(tmp_path):
    assert _lines(tmp_path, b'{"a":1}\n{"b":2}\n') == [
        (1, {"a": 1}, False, False, True),
        (2, {"b": 2}, False, True, True),
    ]
    assert _lines(tmp_path, b'{"a":1}\n  \n\n{"b":2}\n \n\n') == [
        (1, {"a": 1}, False, False, True),
        (4, {"b": 2}, False, True, True),
    ]
    assert _lines(tmp_path, b'{"a":1}\n{"b":') == [(1, {"a": 1}, False, False, True), (2, None, True, True, False)]
    assert _lines(tmp_path, b'{"a":\n{"b":2}') == [(1, None, True, False, True), (2, {"b": 2}, False, True, False)]
    assert _lines(tmp_path, b"") == [] and _lines(tmp_path, b"\n \n") == []


def test_reading_is_linear_in_the_file_size(tmp_path):
    """8,000 lines of ~4 KB (32 MB): a copy of the rest of the file per line would move ~130 GB."""
    row = b'{"text": "' + b"x" * 4000 + b'"}\n'
    path = tmp_path / "big.jsonl"
    path.write_bytes(row * 8000)
    t = time.perf_counter()
    n = sum(1 for _ in jsonl_lines(path))
    assert n == 8000 and time.perf_counter() - t < 10, time.perf_counter() - t
