"""Summarisation prompts from installed prose: what counts as a paragraph of prose, how passages are cut, the
rows (deterministic, one of the wordings, provenance in meta) and the blend source of kind prose."""

import json

from draftlab.blend import blend
from draftlab.dataset_discovery.prose import TEMPLATES, passages, prose_conversations, prose_paragraphs

README = """\
<p align="center"><img src="logo.png"></p>

[![Tests](https://example.org/badge.svg)](https://example.org/ci)

# Widget

Widget turns **plain text files** into [searchable indexes](https://example.org/docs) that stay small and
fast, so that a laptop can search a whole library of documents in well under a second.

```python
# this fenced block reads like a sentence but it is code and must never be kept as prose here
index = widget.build("docs/")
```

Install it:

    pip install widget

- Added a flag that makes the index build twice as fast on machines with many cores.
- Fixed a crash when a file of the library is empty or unreadable.

Usage
=====

| option | meaning |
|---|---|
| --fast | build fast |

>>> widget.search(index, "tides")
['docs/sea.txt']

The index keeps one entry per word and file, and the search reads only the entries of the words asked for,
which is why it answers quickly even when the library grows to many thousands of files.
"""


def test_only_the_prose_paragraphs_are_kept_without_their_markup():
    assert prose_paragraphs(README) == [
        "Widget turns plain text files into searchable indexes that stay small and fast, so that a laptop can "
        "search a whole library of documents in well under a second.",
        "The index keeps one entry per word and file, and the search reads only the entries of the words asked "
        "for, which is why it answers quickly even when the library grows to many thousands of files.",
    ]


def test_passages_join_paragraphs_and_cut_long_ones_at_sentence_ends():
    para = [" ".join(f"w{i}x{j}" for j in range(50)) for i in range(5)]  # five paragraphs of 50 words
    out = passages(para, min_words=120, max_words=400)
    assert out == ["\n\n".join(para[:3])]  # 150 words; the last 100 are too few and dropped
    long = " ".join(f"This is sentence number {i} of a very long paragraph." for i in range(100))  # 1,000 words
    cut = passages([long], min_words=120, max_words=400)
    assert [len(p.split()) for p in cut] == [400, 400, 200] and all(p.endswith("paragraph.") for p in cut)


def test_rows_are_requests_to_summarise_with_their_provenance():
    rows = prose_conversations(limit=25)
    assert len(rows) == 25 and rows == prose_conversations(limit=25)  # the same for the same installs
    heads = [t.split("{text}")[0] for t in TEMPLATES]
    for row in rows:
        (turn,) = row["messages"]
        assert turn["role"] == "user" and any(turn["content"].startswith(h) for h in heads)
        assert row["source"] == "prose" and 120 <= row["meta"]["words"] <= 400
        assert row["meta"]["package"] != "draftlab" and row["meta"]["version"]
    assert len({r["id"] for r in rows}) == 25


def test_prose_is_a_blend_source(tmp_path):
    spec = {
        "tokenizer": "none",
        "sources": [{"name": "summaries", "kind": "prose", "count": 12}],
        "decontaminate": {"against": []},
        "filters": {"min_tokens": 1},
        "splits": {"train": 1.0, "val": 0.0, "test": 0.0},
    }
    report = blend(spec, tmp_path / "blend", progress=False)
    assert report["splits"]["train"] == 12
    rows = [json.loads(x) for x in (tmp_path / "blend" / "train.jsonl").read_text().splitlines()]
    assert {r["source"] for r in rows} == {"summaries"} and all(r["meta"]["package"] for r in rows)
