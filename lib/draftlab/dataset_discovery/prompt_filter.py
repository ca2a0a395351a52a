"""Rules that keep a generated user turn only if it reads like a real request (Magpie-style prompts).

A target asked to continue its chat template's user prefix writes mostly plausible requests, but
also empty or one-word turns, rambling loops, refusals, answers instead of questions, and text that
runs on into the assistant's turn. Each rule returns the reason a turn is refused (written beside the
prompts as a reject), or None; `screen` applies them in order. Pure functions: unit-tested on crafted
strings (tests/test_generated_prompts.py).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

REFUSAL = re.compile(
    r"\b(i'?m sorry|i am sorry|i apologi[sz]e|i cannot|i can'?t (help|assist|provide)|i am unable|i'?m unable|"
    r"as an ai\b|as a language model)",
    re.IGNORECASE,
)
# the start of an answer rather than a request ("Sure! Here is ...")
ANSWER_OPENING = re.compile(r"^\s*(sure|certainly|of course|absolutely|great question|here is|here's)\b[,!.: ]", re.I)
# role markers of common chat formats: the text ran into another turn
ROLE_MARKER = re.compile(
    r"<\|[a-z_ ]+\|>|</?s>|\[/?INST\]|^\s*(assistant|user|system)\s*[:\n]|\n\s*(assistant|user|system|human|ai)\s*:"
    r"|###\s*(response|instruction|assistant)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class FilterConfig:
    """The thresholds of the rules; the defaults keep most of what a 135M model writes that reads as a request."""

    min_words: int = 4
    max_words: int = 400
    min_letters: float = 0.55  # letters among non-space characters
    min_latin: float = 0.9  # ASCII letters among letters ("English-ish"; the embedded target is English)
    max_repeat: float = 0.3  # share of a turn's word 3-grams that repeat an earlier one


def too_short_or_long(text: str, cfg: FilterConfig) -> str | None:
    words = len(text.split())
    if words < cfg.min_words:
        return f"too short ({words} words < {cfg.min_words})"
    if words > cfg.max_words:
        return f"too long ({words} words > {cfg.max_words})"
    return None


def not_language(text: str, cfg: FilterConfig) -> str | None:
    chars = [c for c in text if not c.isspace()]
    letters = [c for c in chars if c.isalpha()]
    if not chars or len(letters) / len(chars) < cfg.min_letters:
        return f"not language-like ({len(letters)}/{len(chars)} letters)"
    latin = sum(c.isascii() for c in letters)
    if latin / len(letters) < cfg.min_latin:
        return f"not English-like ({latin}/{len(letters)} ASCII letters)"
    return None


def leakage(text: str, markers: tuple[str, ...] = ()) -> str | None:
    """The turn holds the template's own markers, another role's label, or opens like an answer."""
    for marker in markers:
        if marker and marker in text:
            return f"assistant leakage (template marker {marker!r})"
    found = ROLE_MARKER.search(text)
    if found:
        return f"assistant leakage (role marker {found.group(0).strip()!r})"
    if ANSWER_OPENING.search(text):
        return "assistant leakage (opens like an answer)"
    return None


def refusal(text: str) -> str | None:
    found = REFUSAL.search(text)
    return f"refusal ({found.group(0)!r})" if found else None


def repeated(text: str, cfg: FilterConfig) -> str | None:
    words = text.lower().split()
    grams = list(zip(words, words[1:], words[2:]))
    if len(grams) < 6:
        return None
    counts = Counter(grams)
    repeats = sum(c - 1 for c in counts.values())
    if repeats / len(grams) > cfg.max_repeat:
        return f"repeated n-grams ({repeats}/{len(grams)} word 3-grams repeat)"
    return None


def screen(text: str, cfg: FilterConfig = FilterConfig(), markers: tuple[str, ...] = ()) -> str | None:
    """Why this generated user turn is refused, or None to keep it."""
    if not text.strip():
        return "empty"
    return (
        leakage(text, markers)
        or too_short_or_long(text, cfg)
        or not_language(text, cfg)
        or refusal(text)
        or repeated(text, cfg)
    )


def reason_kind(reason: str) -> str:
    """A reject reason without its detail, for counts ('too short', 'assistant leakage', ...)."""
    return reason.split(" (", 1)[0]
