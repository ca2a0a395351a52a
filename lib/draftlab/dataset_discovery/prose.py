"""Summarisation prompts without a hub: passages of real prose from what this machine has installed.

Why: the evaluation suite asks for summaries of a long text, and no offline source had a text to train on
(passages the target writes itself are thin). Every installed distribution's long description (its README)
and the standard library's language reference (`pydoc_data.topics`) hold prose. Markup, code, tables,
headings and badges are dropped, and consecutive paragraphs of one document are joined into passages of
MIN..MAX words. Each passage becomes a request to summarise it, in a wording picked by a hash of the passage,
so the rows are the same for the same installed versions (recorded in each row's meta).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
import sys
from typing import Iterator

from draftlab.core.records import conversation_id

PROSE_SOURCE = "prose"
TEMPLATES = (
    "Summarize the following passage in three sentences.\n\n{text}",
    "Give me a short summary of this text:\n\n{text}",
    "What are the main points of the following text?\n\n{text}",
    "Summarize this for a busy reader in one paragraph:\n\n{text}",
)
FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")  # [text](url) -> text; images too
EMPHASIS = re.compile(r"(\*\*|__|\*)(\S[^*_]*?)\1")
# a line that makes its paragraph not prose: HTML, a table, a heading or rst underline, a directive, a
# console or shell line, a badge or image, an indented block
NOT_PROSE = re.compile(r"^(<|\||#|\.\. |\s*>>>|\$ |\[!\[|!\[|=|-{3,}|\*{3,}|:[a-z]+:|\s{4})")
LIST_ITEM = re.compile(r"^\s*([-*+•]|\d+[.)]|\(\w\))\s")  # lists (changelogs, options) are not prose to summarise


def _not_prose(line: str) -> bool:
    return bool(NOT_PROSE.match(line) or LIST_ITEM.match(line)) or set(line.strip()) <= set("=-~^*#+")


def prose_paragraphs(text: str) -> list[str]:
    """The prose paragraphs of a README (markdown or reStructuredText) or a reference page, markup removed."""
    paragraphs, block, fenced = [], [], False
    for line in text.splitlines() + [""]:
        if FENCE.match(line):
            fenced, block = not fenced, []
            continue
        if fenced:
            continue
        if line.strip():
            block.append(line)
            continue
        if block and not any(_not_prose(b) for b in block):
            para = EMPHASIS.sub(r"\2", LINK.sub(r"\1", " ".join(b.strip() for b in block)))
            words = para.split()
            letters = sum(c.isalpha() for c in para)
            if len(words) >= 12 and letters >= 0.7 * len(para.replace(" ", "")) and "http" not in para:
                paragraphs.append(" ".join(words))
        block = []
    return paragraphs


def passages(paragraphs: list[str], min_words: int = 120, max_words: int = 400) -> list[str]:
    """Consecutive paragraphs joined into passages of min_words..max_words; a longer paragraph is cut at
    sentence ends; what is left shorter than min_words at the end is dropped."""
    sentences_runs: list[str] = []
    for para in paragraphs:
        if len(para.split()) <= max_words:
            sentences_runs.append(para)
            continue
        run: list[str] = []
        for sentence in re.split(r"(?<=[.!?])\s+", para):
            if run and len(" ".join(run + [sentence]).split()) > max_words:
                sentences_runs.append(" ".join(run))
                run = []
            run.append(sentence)
        if run:
            sentences_runs.append(" ".join(run))
    out, current = [], []
    for piece in sentences_runs:
        if current and len(" ".join(current + [piece]).split()) > max_words:
            if len(" ".join(current).split()) >= min_words:
                out.append("\n\n".join(current))
            current = []
        current.append(piece)
        if len(" ".join(current).split()) >= min_words:
            out.append("\n\n".join(current))
            current = []
    return [p for p in out if min_words <= len(p.split()) <= max_words]


def documents() -> Iterator[tuple[str, str, str]]:
    """(package, version, text): each installed distribution's long description, by name, then the
    standard library's reference topics."""
    seen = set()
    for dist in sorted(importlib.metadata.distributions(), key=lambda d: (d.metadata["Name"] or "").lower()):
        name = dist.metadata["Name"] or ""
        if not name or name.lower() in seen or name.lower() == "draftlab":  # not this toolkit's own README
            continue
        seen.add(name.lower())
        body = dist.metadata.get_payload() or dist.metadata.get("Description") or ""
        if body.strip():
            yield name, dist.version, body
    try:
        from pydoc_data.topics import topics
    except ImportError:  # an interpreter built without it
        return
    version = ".".join(map(str, sys.version_info[:3]))
    for key in sorted(topics):
        yield f"python-reference:{key}", version, topics[key]


def prose_conversations(
    limit: int | None = None, source: str = PROSE_SOURCE, min_words: int = 120, max_words: int = 400
) -> list[dict]:
    """Canonical conversations, one user turn each: a request to summarise one passage (documents' order)."""
    rows = []
    for package, version, text in documents():
        for i, passage in enumerate(passages(prose_paragraphs(text), min_words, max_words)):
            pick = int.from_bytes(hashlib.blake2b(passage.encode(), digest_size=4).digest(), "big")
            messages = [{"role": "user", "content": TEMPLATES[pick % len(TEMPLATES)].format(text=passage)}]
            meta = {"package": package, "version": version, "passage": i, "words": len(passage.split())}
            rows.append({"id": conversation_id(messages, source), "source": source, "messages": messages, "meta": meta})
            if limit is not None and len(rows) >= limit:
                return rows
    return rows
