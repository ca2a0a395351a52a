"""Every option of `blend`, `regenerate` and `monitor` that takes a number, a path or a URL, tried with a
bad value, as a real `draftlab` process (servers are loopback stubs: tests/helpers_regen/stub_servers.py).

Wanted for each case: exit 2 for bad input, 1 for a run that cannot go on; exactly one `error: ...`
line on stderr, the last (progress lines may come before it), naming the option (or file, row, field);
no traceback; what an earlier run wrote is still there; never exit 0 with an empty result. A failing
case says its outcome first (wrong / traceback / silent); FAULTS_TALLY=FILE writes one line per case,
FAULTS_LIB=DIR runs another tree's lib (the counts before a change).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from draftlab.core.serve import free_port
from helpers_regen import make_conversations, run_draftlab, write_jsonl
from helpers_regen.stub_servers import StubServer

LIB = os.environ.get("FAULTS_LIB") or str(Path(__file__).resolve().parents[1] / "lib")  # FAULTS_LIB: another tree
TIMEOUT_S = 60

# ---------------------------------------------------------------------------------------------- cases
# (id, command, argv after the command with {in} {work} {url} {tmp} {spec} {out} {file} placeholders,
#  expected exit, words the error line must hold). A case's argv replaces the good run's options of the same
#  name, so each case changes one thing.

REGEN = ["{in}", "{work}", "--base-url", "{url}", "--model", "m", "--no-progress"]


def _with(base: list[str], *pairs: str) -> list[str]:
    """`base` with each (option, value) pair replacing that option's value, or added."""
    out = list(base)
    for opt, value in zip(pairs[::2], pairs[1::2]):
        if opt in out:
            out[out.index(opt) + 1] = value
        else:
            out += [opt, value]
    return out


NUMBERS = [
    ("--max-tokens", ["0", "-1", "abc"]),
    ("--temperature", ["-1", "nan", "inf"]),
    ("--top-p", ["0", "1.5", "nan"]),
    ("--seed", ["-1", "abc"]),
    ("--max-assistant-turns", ["-1"]),
    ("--concurrency", ["0", "-3"]),
    ("--timeout", ["0", "nan", "-1"]),
    ("--max-retries", ["-1", "abc"]),
    ("--max-outage", ["nan", "-1", "inf"]),
    ("--limit", ["-1", "x"]),
    ("--shard-rows", ["0"]),
    ("--sglang-servers", ["-1"]),
    ("--batch-size", ["0"]),
    ("--batch-tokens", ["-1"]),
]
CASES = [
    (f"regenerate {opt} {value}", "regenerate", _with(REGEN, opt, value), 2, [opt])
    for opt, values in NUMBERS
    for value in values
]
CASES += [
    ("regenerate input missing", "regenerate", ["{tmp}/nope.jsonl", *REGEN[1:]], 2, ["nope.jsonl"]),
    ("regenerate input is a folder", "regenerate", ["{tmp}", *REGEN[1:]], 2, ["is a folder"]),
    ("regenerate work is a file", "regenerate", ["{in}", "{file}", *REGEN[2:]], 2, ["afile"]),
    ("regenerate --output is a folder", "regenerate", _with(REGEN, "--output", "{tmp}"), 2, ["--output"]),
    ("regenerate --output under a file", "regenerate", _with(REGEN, "--output", "{file}/o.jsonl"), 2, ["--output"]),
    ("regenerate --log-dir is a file", "regenerate", _with(REGEN, "--log-dir", "{file}"), 2, ["--log-dir"]),
    ("regenerate --serve missing", "regenerate", ["{in}", "{work}", "--serve", "{tmp}/nosuch"], 2, ["--serve"]),
    ("regenerate --base-url no scheme", "regenerate", _with(REGEN, "--base-url", "localhost:8000"), 2, ["--base-url"]),
    ("regenerate --base-url ftp", "regenerate", _with(REGEN, "--base-url", "ftp://127.0.0.1:21"), 2, ["--base-url"]),
    ("regenerate --base-url no host", "regenerate", _with(REGEN, "--base-url", "http://"), 2, ["--base-url"]),
    (
        "regenerate --base-url bad port",
        "regenerate",
        _with(REGEN, "--base-url", "http://127.0.0.1:99999"),
        2,
        ["--base-url"],
    ),
    ("regenerate --base-url query", "regenerate", _with(REGEN, "--base-url", "{url}/v1?key=1"), 2, ["--base-url"]),
    ("regenerate --base-url other path", "regenerate", _with(REGEN, "--base-url", "{url}/api"), 2, ["--base-url"]),
    ("regenerate --base-url dead", "regenerate", _with(REGEN, "--base-url", "{dead}"), 1, ["no server"]),
    ("regenerate server drops", "regenerate", _with(REGEN, "--base-url", "{drop}", "--max-outage", "2"), 1, ["answer"]),
    (
        "regenerate server hangs",
        "regenerate",
        _with(REGEN, "--base-url", "{hang}", "--timeout", "1", "--max-outage", "2"),
        1,
        ["answer"],
    ),
    (
        "regenerate server 500",
        "regenerate",
        _with(REGEN, "--base-url", "{s500}", "--max-retries", "0"),
        1,
        ["HTTP 500"],
    ),
    (
        "regenerate server malformed",
        "regenerate",
        _with(REGEN, "--base-url", "{malformed}", "--max-retries", "0"),
        1,
        ["malformed"],
    ),
    ("regenerate server answers empty", "regenerate", _with(REGEN, "--base-url", "{empty}"), 1, ["empty answer"]),
    ("regenerate resume other input", "regenerate", ["{in2}", *REGEN[1:]], 2, ["input"]),
    ("regenerate resume other model", "regenerate", _with(REGEN, "--model", "other"), 2, ["model"]),
    ("regenerate resume other sampling", "regenerate", _with(REGEN, "--temperature", "0.5"), 2, ["temperature"]),
]
MONITOR = ["{work}"]
CASES += [
    (f"monitor {opt} {value}", "monitor", _with(MONITOR, opt, value), 2, [opt])
    for opt, values in [("--window", ["0", "-1", "nan", "x"]), ("--watch", ["-1", "nan", "inf"])]
    for value in values
]
CASES += [
    ("monitor work missing", "monitor", ["{tmp}/nosuch"], 2, ["nosuch"]),
    ("monitor work is a file", "monitor", ["{file}"], 2, ["afile"]),
    ("monitor not a work folder", "monitor", ["{tmp}"], 2, ["manifest.json"]),
    ("monitor --plot is a folder", "monitor", _with(MONITOR, "--plot", "{tmp}"), 2, ["--plot"]),
    ("monitor --plot under a file", "monitor", _with(MONITOR, "--plot", "{file}/p.png"), 2, ["--plot"]),
]
BLEND = ["{spec}", "--out", "{out}"]
SPEC_CASES = [  # (id, change to the good spec, words)
    ("weight nan", {"total": 3, "sources": [{"weight": float("nan")}]}, ["weight"]),
    ("weight inf", {"total": 3, "sources": [{"weight": float("inf")}]}, ["weight"]),
    ("weight string", {"total": 3, "sources": [{"weight": "ten"}]}, ["weight"]),
    ("weight negative", {"total": 3, "sources": [{"weight": -1}]}, ["weight"]),
    ("weights all 0", {"total": 3, "sources": [{"weight": 0}]}, ["weight"]),
    ("count negative", {"sources": [{"count": -2}]}, ["count"]),
    ("count string", {"sources": [{"count": "ten"}]}, ["count"]),
    ("count nan", {"sources": [{"count": float("nan")}]}, ["count"]),
    ("total string", {"total": "many", "sources": [{"weight": 1}]}, ["total"]),
    ("total 0 in spec", {"total": 0}, ["total"]),
    ("num_perm 0", {"dedup": {"num_perm": 0}}, ["num_perm"]),
    ("threshold 1.5", {"dedup": {"threshold": 1.5}}, ["threshold"]),
    ("threshold nan", {"dedup": {"threshold": float("nan")}}, ["threshold"]),
    ("shingle 0", {"dedup": {"shingle": 0}}, ["shingle"]),
    ("ngram 0", {"decontaminate": {"ngram": 0}}, ["ngram"]),
    ("oversample 0", {"oversample": 0}, ["oversample"]),
    ("oversample nan", {"oversample": float("nan")}, ["oversample"]),
    ("split fraction negative", {"splits": {"train": 1.2, "val": -0.1, "test": -0.1}}, ["splits"]),
    ("split fraction nan", {"splits": {"train": float("nan"), "val": 0.5, "test": 0.5}}, ["splits"]),
    ("min_tokens negative", {"filters": {"min_tokens": -1}}, ["min_tokens"]),
    ("max_tokens 0", {"filters": {"max_tokens": 0}}, ["max_tokens"]),
    ("max_chars string", {"filters": {"max_chars": "lots"}}, ["max_chars"]),
    ("max_rows negative", {"sources": [{"max_rows": -5}]}, ["max_rows"]),
    ("seed string", {"seed": "abc"}, ["seed"]),
    ("nothing survives", {"filters": {"min_tokens": 100000}}, ["no rows"]),
]
CASES += [(f"blend spec {name}", "blend", BLEND, 2, [*words, "spec"]) for name, _, words in SPEC_CASES]
CASES += [
    ("blend --total -10", "blend", _with(BLEND, "--total", "-10"), 2, ["--total"]),
    ("blend --total 0", "blend", _with(BLEND, "--total", "0"), 2, ["--total"]),
    ("blend --total x", "blend", _with(BLEND, "--total", "x"), 2, ["--total"]),
    ("blend --seed x", "blend", _with(BLEND, "--seed", "x"), 2, ["--seed"]),
    ("blend --seed -1", "blend", _with(BLEND, "--seed", "-1"), 2, ["--seed"]),
    ("blend spec missing", "blend", ["{tmp}/nope.yaml", "--out", "{out}"], 2, ["nope.yaml"]),
    ("blend spec is a folder", "blend", ["{tmp}", "--out", "{out}"], 2, ["folder"]),
    ("blend --out is a file", "blend", ["{spec}", "--out", "{file}"], 2, ["afile"]),
    ("blend source missing", "blend", ["{spec_missing}", "--out", "{out}"], 2, ["gone.jsonl"]),
]
SPEC_CHANGES = {f"blend spec {name}": change for name, change, _ in SPEC_CASES}


# ---------------------------------------------------------------------------------------------- set-up


@pytest.fixture(scope="module")
def servers():
    stubs = {
        "url": StubServer("ok"),
        "drop": StubServer("drop"),
        "hang": StubServer("hang"),
        "s500": StubServer("500"),
        "malformed": StubServer("malformed"),
        "empty": StubServer("ok", answer=""),
    }
    for s in stubs.values():
        s.start()
    yield {k: s.base_url for k, s in stubs.items()} | {"dead": f"http://127.0.0.1:{free_port()}"}
    for s in stubs.values():
        s.stop()


@pytest.fixture(scope="module")
def finished_work(tmp_path_factory, servers):
    """A work folder where an earlier run finished 2 of the input's 3 rows (each case gets a copy)."""
    root = tmp_path_factory.mktemp("earlier")
    src = write_jsonl(root / "in.jsonl", make_conversations(3, multi_turn_every=0, prompt_only_every=0))
    proc = draftlab(
        "regenerate", src, root / "work", "--base-url", servers["url"], "--model", "m", "--limit", "2", "--no-progress"
    )
    assert proc.returncode == 0, proc.stderr
    return root


def draftlab(*argv, timeout=TIMEOUT_S, cwd=None):
    return run_draftlab(*argv, timeout=timeout, lib=LIB, cwd=cwd)


def _merge(base: dict, change: dict) -> dict:
    out = json.loads(json.dumps(base))
    for key, value in change.items():
        if key == "sources":
            for src, extra in zip(out["sources"], value):
                src.update(extra)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key].update(value)
        else:
            out[key] = value
    return out


def _blend_spec(tmp: Path, change: dict | None) -> Path:
    rows = [
        {"instruction": f"Write a function number {i} that adds two numbers", "output": "def f(): pass"}
        for i in range(3)
    ]
    (tmp / "good.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {
        "name": "faults",
        "tokenizer": "none",
        "decontaminate": {"against": []},
        "filters": {"min_tokens": 1, "max_tokens": 4000},
        "splits": {"train": 1.0, "val": 0.0, "test": 0.0},
        "sources": [{"name": "good", "kind": "local", "path": str(tmp / "good.jsonl")}],
    }
    path = tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(_merge(spec, change or {}), sort_keys=False))
    gone = _merge(spec, {"sources": [{"path": str(tmp / "gone.jsonl")}]})
    (tmp / "spec_missing.yaml").write_text(yaml.safe_dump(gone))
    return path


def _digest(folder: Path) -> dict:
    """Every file's sha256 under a folder (what must still be there after a failed case)."""
    skip = {".lock", "manifest.json", "status.json"}
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name not in skip
    }


def outcome(proc, code: int, words: list[str], kept_before: dict, kept_after: dict) -> str:
    """'right', or the first thing wrong: traceback / silent (exit 0) / wrong (anything else)."""
    if "Traceback" in proc.stderr:
        return "traceback: " + proc.stderr.strip().splitlines()[-1][:200]
    if proc.returncode == 0:
        return "silent: exit 0"
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    if proc.returncode != code:
        return f"wrong: exit {proc.returncode}, wanted {code}: {' | '.join(lines)[:300]}"
    errors = [x for x in lines if x.startswith("error: ")]
    if len(errors) != 1 or lines[-1] != errors[0]:  # progress lines before it are fine; one error, last
        return f"wrong: {len(errors)} error lines in {len(lines)}: {' | '.join(lines)[-300:]}"
    missing = [w for w in words if w not in errors[0]]
    if missing:
        return f"wrong: {missing} not in {errors[0][:300]!r}"
    lost = [k for k, v in kept_before.items() if kept_after.get(k) != v and not k.startswith("errors")]
    if lost:
        return f"wrong: changed or lost {lost}"
    return "right"


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_option_value(case, tmp_path, servers, finished_work):
    name, command, argv, code, words = case
    work = tmp_path / "work"
    shutil.copytree(finished_work / "work", work)
    shutil.copy(finished_work / "in.jsonl", tmp_path / "in.jsonl")
    write_jsonl(tmp_path / "in2.jsonl", make_conversations(3, multi_turn_every=0, prompt_only_every=0, source="other"))
    (tmp_path / "afile").write_text("not a folder\n")
    spec = _blend_spec(tmp_path, SPEC_CHANGES.get(name))
    out = tmp_path / "out"
    if command == "blend":  # an earlier blend's files must survive a refused one
        out.mkdir()
        (out / "train.jsonl").write_text('{"id": "earlier"}\n')
    places = {
        "in": tmp_path / "in.jsonl",
        "in2": tmp_path / "in2.jsonl",
        "work": work,
        "tmp": tmp_path,
        "file": tmp_path / "afile",
        "spec": spec,
        "spec_missing": tmp_path / "spec_missing.yaml",
        "out": out,
        **servers,
    }
    args = [a.format(**places) for a in argv]
    watched = out if command == "blend" else work
    before = _digest(watched)
    try:
        proc = draftlab(command, *args, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"wrong: still running after {TIMEOUT_S} s")
    result = outcome(proc, code, words, before, _digest(watched))
    if os.environ.get("FAULTS_TALLY"):  # one line per case: the before/after counts of the report
        with open(os.environ["FAULTS_TALLY"], "a") as fh:
            fh.write(f"{name}\t{result}\n")
    assert result == "right", result
