"""Fault-injection sweep (issue 19): every `draftlab` command, as a real subprocess, against a missing
path, an unreadable file, a file of the wrong type and, where it takes a server URL, a dead server.

Wanted outcome for every case: a non-zero exit and no Python traceback, so that a user sees one line
naming what is wrong instead of a stack. Each case is bounded by a subprocess timeout, so a command that
would wait forever (a dead server) fails here instead of hanging the suite.

"Unreadable" is a directory where a file is expected: the tests may run as root, where chmod 000 does
not stop reads, and a fifo would block the reader instead of failing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from draftlab.core.serve import free_port

FAULTS = ("missing", "directory", "random", "dead_server")
TIMEOUT_S = 180  # the commands that load the embedded target take ~20 s on a loaded 2-core CPU

# (case name, argv template, suffix of the path under test, faults). "{path}" is the path under test;
# "{url}" a server URL (a closed port for dead_server, else the same closed port, unused before the path).
COMMANDS = [
    ("run", ["run", "{path}", "--profile", "smoke"], "", ("missing",)),
    ("target", ["target", "{path}"], ".gguf", ("missing", "directory", "random")),
    ("blend", ["blend", "{path}", "--out", "{tmp}/out"], ".yaml", ("missing", "directory", "random")),
    (
        "regenerate",
        ["regenerate", "{path}", "{tmp}/work", "--base-url", "{url}", "--model", "x", "--no-progress"],
        ".jsonl",
        ("missing", "directory", "random", "dead_server"),
    ),
    ("monitor", ["monitor", "{path}"], "", ("missing", "random")),
    (
        "train",
        ["train", "--train-file", "{path}", "--out-dir", "{tmp}/train", "--target", "tiny"],
        ".jsonl",
        ("missing", "directory", "random"),
    ),
    ("export", ["export", "{path}", "{tmp}/exported"], "", ("missing", "random")),
    ("export_validate", ["export", "--validate-only", "{tmp}/unused", "{path}"], "", ("missing", "random")),
    ("doctor_draft", ["doctor", "--draft", "{path}", "--target", "tiny"], "", ("missing", "random")),
    ("doctor_server_info", ["doctor", "--server-info", "{path}"], ".json", ("missing", "directory", "random")),
    ("doctor_probe", ["doctor", "--probe", "{url}"], "", ("dead_server",)),
    ("sglang_stage", ["sglang", "stage", "--parts-dir", "{path}", "--stage", "{tmp}/stage"], "", ("missing", "random")),
    (
        "sglang_install",
        ["sglang", "install", "--stage", "{path}", "--prefix", "{tmp}/prefix"],
        "",
        ("missing", "random"),
    ),
    ("bench_blend", ["bench", "blend", "-n", "10", "--tokenizer", "{path}"], ".gguf", ("missing", "random")),
    (
        "bench_client",
        ["bench", "client", "--base-url", "{url}", "--model", "x", "--n", "2", "--rounds", "1"],
        "",
        ("dead_server",),
    ),
    (
        "bench_generate",
        ["bench", "generate", "{path}", "--target", "tiny"],
        ".jsonl",
        ("missing", "directory", "random"),
    ),
    (
        "bench_live",
        ["bench", "live", "--baseline", "{url}", "--eval-set", "{path}"],
        ".jsonl",
        ("missing", "directory", "random"),
    ),
    (
        "bench_live_server",
        [
            "bench",
            "live",
            "--baseline",
            "{url}",
            "--samples",
            "2",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--concurrency",
            "1",
        ],
        "",
        ("dead_server",),
    ),
    ("bench_specdec_draft", ["bench", "specdec", "--target", "tiny", "--draft", "{path}"], "", ("missing", "random")),
    (
        "bench_specdec_eval",
        ["bench", "specdec", "--target", "tiny", "--draft", "{tmp}", "--eval-set", "{path}"],
        ".jsonl",
        ("missing", "directory", "random"),
    ),
    ("bench_sglang", ["bench", "sglang", "--draft", "{path}", "--python", sys.executable], "", ("missing",)),
]


def _cases():
    for name, argv, suffix, faults in COMMANDS:
        for fault in faults:
            case = f"{name}-{fault}"
            yield pytest.param(argv, suffix, fault, id=case)


def _path_under_test(tmp_path, suffix: str, fault: str) -> str:
    path = tmp_path / f"input{suffix}"
    if fault == "directory":
        path.mkdir()
        (path / "inside").write_text("a directory where a file is expected\n")
    elif fault in ("random", "dead_server"):
        path.write_bytes(os.urandom(4096))
    return str(path)


def run_case(argv: list[str], suffix: str, fault: str, tmp_path) -> subprocess.CompletedProcess:
    """One command under one fault, as the user would run it: a child process, bounded in time."""
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    values = {"path": _path_under_test(tmp_path, suffix, fault), "tmp": str(tmp_path), "url": url}
    args = [a.format(**values) for a in argv]
    env = dict(
        os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1"
    )
    try:
        return subprocess.run(
            [sys.executable, "-m", "draftlab.cli", *args],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env=env,
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"no outcome within {TIMEOUT_S} s: draftlab {' '.join(args)}\n{exc.stdout}\n{exc.stderr}")


@pytest.mark.parametrize(("argv", "suffix", "fault"), list(_cases()))
def test_fault_gives_one_line_error(argv, suffix, fault, tmp_path, request):
    proc = run_case(argv, suffix, fault, tmp_path)
    output = proc.stdout + proc.stderr
    if os.environ.get("DRAFTLAB_FAULTS_LOG"):  # the before/after counts of the closing note
        with open(os.environ["DRAFTLAB_FAULTS_LOG"], "a") as fh:
            fh.write(
                json.dumps(
                    {"case": request.node.callspec.id, "rc": proc.returncode, "traceback": "Traceback" in output}
                )
                + "\n"
            )
    assert "Traceback" not in output, output[-3000:]
    assert proc.returncode != 0, output[-3000:]


# ---------------------------------------------------------------- this branch's cases, one by one


def draftlab(*args, cwd, timeout=TIMEOUT_S) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "draftlab.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


def assert_one_line_error(proc, *names):
    """Exit 2, no traceback, the error on stderr (not stdout) naming each of `names`."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert "error" not in proc.stdout.lower(), proc.stdout
    line = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert len(line) == 1, proc.stderr
    for name in names:
        assert str(name) in line[0], line[0]


ALPACA = b'{"instruction": "Write a function that adds two numbers", "output": "def add(a, b):\\n    return a + b"}\n'


def blend_spec(tmp_path, sources: list[dict]) -> str:
    import yaml

    spec = {
        "name": "faults",
        "tokenizer": "none",
        "decontaminate": {"against": []},
        "filters": {"min_tokens": 1, "max_tokens": 4000},
        "sources": [{"name": "good", "kind": "local", "path": str(tmp_path / "good.jsonl")}, *sources],
    }
    (tmp_path / "good.jsonl").write_bytes(ALPACA * 3)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def _broken_parquets(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = tmp_path / "whole.parquet"
    pq.write_table(pa.table({"instruction": ["a question"] * 50, "output": ["an answer"] * 50}), good)
    data = good.read_bytes()
    (tmp_path / "truncated.parquet").write_bytes(data[: len(data) // 2])
    (tmp_path / "random.parquet").write_bytes(os.urandom(4096))


@pytest.mark.parametrize(
    "name, content",
    [
        ("truncated.parquet", None),
        ("random.parquet", None),
        ("quote.csv", b'instruction,output\n"an unterminated quote,answer\nx,y\n'),
    ],
)
def test_blend_unreadable_source_is_one_line_naming_the_file(tmp_path, name, content):
    _broken_parquets(tmp_path)
    if content is not None:
        (tmp_path / name).write_bytes(content)
    spec = blend_spec(tmp_path, [{"name": "bad", "kind": "local", "path": str(tmp_path / name)}])
    proc = draftlab("blend", spec, "--out", tmp_path / "out", cwd=tmp_path)
    assert_one_line_error(proc, tmp_path / name, "cannot be read as")


def test_blend_empty_sources_are_rejected_and_the_blend_goes_on(tmp_path):
    import json

    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "blank.csv").write_bytes(b"\n   \n\n")
    spec = blend_spec(
        tmp_path,
        [
            {"name": "empty", "kind": "local", "path": str(tmp_path / "empty.jsonl")},
            {"name": "blank", "kind": "local", "path": str(tmp_path / "blank.csv")},
        ],
    )
    proc = draftlab("blend", spec, "--out", tmp_path / "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "rejected source empty" in proc.stderr and "rejected source blank" in proc.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [r["source"] for r in report["rejected_sources"]] == ["empty", "blank"]
    assert sum(report["splits"].values()) == 1  # the good source's three rows are one row after dedup
    rejects = [json.loads(ln) for ln in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert {(r["source"], r["line"]) for r in rejects} == {("empty", None), ("blank", None)}


def test_blend_required_empty_source_stops_the_blend(tmp_path):
    (tmp_path / "empty.jsonl").write_bytes(b"\n\n")
    spec = blend_spec(
        tmp_path, [{"name": "must", "kind": "local", "path": str(tmp_path / "empty.jsonl"), "required": True}]
    )
    proc = draftlab("blend", spec, "--out", tmp_path / "out", cwd=tmp_path)
    assert_one_line_error(proc, "'must'", "required")
    assert not (tmp_path / "out" / "train.jsonl").exists()


def test_blend_rejects_name_the_line_an_editor_shows(tmp_path):
    import json

    lines = [ALPACA, b'{"instruction": "no output here"}\n', b"\n", b"not json\n", ALPACA.replace(b"adds", b"sums")]
    (tmp_path / "mixed.jsonl").write_bytes(b"".join(lines))
    (tmp_path / "rows.csv").write_bytes(b'instruction,output\nq1,a1\n"q2",\nq3,a3\n')
    spec = blend_spec(
        tmp_path,
        [
            {"name": "mixed", "kind": "local", "path": str(tmp_path / "mixed.jsonl")},
            {"name": "rows", "kind": "local", "path": str(tmp_path / "rows.csv")},
        ],
    )
    proc = draftlab("blend", spec, "--out", tmp_path / "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rejects = [json.loads(ln) for ln in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert {(r["source"], r["line"]) for r in rejects} == {("mixed", 2), ("mixed", 4), ("rows", 3)}


def test_train_checks_its_inputs_before_loading_the_target(tmp_path):
    """A target that does not exist: the error must still be the train file's, so it was checked first."""
    proc = draftlab(
        "train",
        "--train-file",
        tmp_path / "missing.jsonl",
        "--out-dir",
        tmp_path / "t",
        "--target",
        tmp_path / "no-such-target",
        cwd=tmp_path,
        timeout=120,
    )
    assert_one_line_error(proc, tmp_path / "missing.jsonl", "does not exist")
    proc = draftlab(
        "train",
        "--train-file",
        tmp_path,
        "--out-dir",
        tmp_path / "t",
        "--target",
        tmp_path / "no-such-target",
        cwd=tmp_path,
        timeout=120,
    )
    assert_one_line_error(proc, "is a folder")


def test_train_resume_with_another_recipe_is_one_line(tmp_path):
    import dataclasses
    import json

    import torch
    from safetensors.torch import save_file

    from draftlab.train_draft.config import TrainConfig

    (tmp_path / "train.jsonl").write_bytes(b"{}\n")
    ck = tmp_path / "t" / "ckpt-0000003"
    ck.mkdir(parents=True)
    old = dataclasses.asdict(
        TrainConfig(train_file=str(tmp_path / "train.jsonl"), out_dir=str(tmp_path / "t"), lr=5e-4)
    )
    (ck / "state.json").write_text(json.dumps({"train_config": old, "step": 3}))
    for name in ("draft.safetensors", "optimizer.safetensors"):  # a complete checkpoint of another lr
        save_file({"w": torch.zeros(2)}, str(ck / name))
    proc = draftlab(
        "train",
        "--train-file",
        tmp_path / "train.jsonl",
        "--out-dir",
        tmp_path / "t",
        "--resume",
        "--target",
        tmp_path / "no-such-target",
        cwd=tmp_path,
        timeout=120,
    )
    assert_one_line_error(proc, ck, "other settings", "'lr'")


def test_bench_specdec_checks_draft_and_eval_set_before_the_target(tmp_path):
    proc = draftlab(
        "bench",
        "specdec",
        "--target",
        tmp_path / "no-such-target",
        "--draft",
        tmp_path / "nodraft",
        cwd=tmp_path,
        timeout=120,
    )
    assert_one_line_error(proc, "--draft", "does not exist")
    (tmp_path / "draft").mkdir()
    (tmp_path / "draft" / "config.json").write_text("{}")
    (tmp_path / "draft" / "model.safetensors").write_bytes(b"")
    proc = draftlab(
        "bench",
        "specdec",
        "--target",
        tmp_path / "no-such-target",
        "--draft",
        tmp_path / "draft",
        "--eval-set",
        tmp_path / "missing.jsonl",
        cwd=tmp_path,
        timeout=120,
    )
    assert_one_line_error(proc, "--eval-set", "does not exist")


def test_precompute_removes_the_temp_files_a_killed_run_left(tmp_path, tiny_target):
    """What SIGKILL mid-shard leaves (a shard's temp file, the index's temp) is removed by the next call;
    a file of the same folder that is not the precompute's own is left alone."""
    import torch

    from draftlab.model.hidden import TMP_SUFFIX, precompute_hidden

    ds = _tiny_dataset(tiny_target)
    out = tmp_path / "hidden"
    out.mkdir()
    leftovers = [
        out / f"shard-00000.safetensors{TMP_SUFFIX}",
        out / "shard-00007.safetensors.tmp",
        out / "index.json.tmp",
    ]
    for path in leftovers:
        path.write_bytes(os.urandom(1 << 16))
    (out / "notes.tmp").write_text("someone else's")
    precompute_hidden(tiny_target, ds, out, batch_tokens=256, shard_tokens=10_000, dtype=torch.float32)
    assert not any(p.exists() for p in leftovers)
    assert (out / "notes.tmp").exists() and (out / "shard-00000.safetensors").is_file()
    assert not list(out.glob(f"*{TMP_SUFFIX}"))


def test_precompute_fails_before_its_first_shard_when_the_disk_is_too_small(tmp_path, tiny_target, monkeypatch):
    import shutil

    import torch

    from draftlab.core.errors import RunFailure
    from draftlab.model import hidden
    from draftlab.model.hidden import precompute_hidden

    monkeypatch.setattr(hidden.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 100, 100))
    with pytest.raises(RunFailure, match=r"hidden.*need 0.0 GB more, 0.0 GB free"):
        precompute_hidden(tiny_target, _tiny_dataset(tiny_target), tmp_path / "hidden", dtype=torch.float32)
    assert not list((tmp_path / "hidden").glob("shard-*"))


def test_resume_removes_half_written_checkpoints(tmp_path):
    from draftlab.train_draft.checkpoint import remove_checkpoint_temps

    (tmp_path / ".ckpt-0000009.tmp").mkdir()
    (tmp_path / ".ckpt-0000009.tmp" / "draft.safetensors").write_bytes(b"half")
    (tmp_path / "ckpt-0000006").mkdir()
    assert remove_checkpoint_temps(tmp_path) == [tmp_path / ".ckpt-0000009.tmp"]
    assert not (tmp_path / ".ckpt-0000009.tmp").exists() and (tmp_path / "ckpt-0000006").is_dir()


def _tiny_dataset(target):
    import datasets

    rows = [{"id": f"r{i}", "input_ids": list(range(5, 5 + 8 + i))} for i in range(6)]
    return datasets.Dataset.from_list(rows)
