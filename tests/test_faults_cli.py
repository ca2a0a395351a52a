"""Fault-injection sweep (issue 19): every `draftlab` command, as a real subprocess, against a missing
path, an unreadable file, a file of the wrong type and, where it takes a server URL, a dead server.

Wanted outcome for every case: a non-zero exit and no Python traceback, so that a user sees one line
naming what is wrong instead of a stack. Each case is bounded by a subprocess timeout, so a command that
would wait forever (a dead server) fails here instead of hanging the suite.

"Unreadable" is a directory where a file is expected: the tests may run as root, where chmod 000 does
not stop reads, and a fifo would block the reader instead of failing. Cases owned by the other parts of
issue 19 (regenerate, monitor, doctor, export) that still fail on this branch are xfail, not strict, so
the merge of the three branches can drop the marks that no longer apply.
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
    ("regenerate", ["regenerate", "{path}", "{tmp}/work", "--base-url", "{url}", "--model", "x", "--no-progress"],
     ".jsonl", ("missing", "directory", "random", "dead_server")),
    ("monitor", ["monitor", "{path}"], "", ("missing", "random")),
    ("train", ["train", "--train-file", "{path}", "--out-dir", "{tmp}/train", "--target", "tiny"], ".jsonl",
     ("missing", "directory", "random")),
    ("export", ["export", "{path}", "{tmp}/exported"], "", ("missing", "random")),
    ("export_validate", ["export", "--validate-only", "{tmp}/unused", "{path}"], "", ("missing", "random")),
    ("doctor_draft", ["doctor", "--draft", "{path}", "--target", "tiny"], "", ("missing", "random")),
    ("doctor_server_info", ["doctor", "--server-info", "{path}"], ".json", ("missing", "directory", "random")),
    ("doctor_probe", ["doctor", "--probe", "{url}"], "", ("dead_server",)),
    ("sglang_stage", ["sglang", "stage", "--parts-dir", "{path}", "--stage", "{tmp}/stage"], "",
     ("missing", "random")),
    ("sglang_install", ["sglang", "install", "--stage", "{path}", "--prefix", "{tmp}/prefix"], "",
     ("missing", "random")),
    ("bench_blend", ["bench", "blend", "-n", "10", "--tokenizer", "{path}"], ".gguf", ("missing", "random")),
    ("bench_client", ["bench", "client", "--base-url", "{url}", "--model", "x", "--n", "2", "--rounds", "1"], "",
     ("dead_server",)),
    ("bench_generate", ["bench", "generate", "{path}", "--target", "tiny"], ".jsonl",
     ("missing", "directory", "random")),
    ("bench_live", ["bench", "live", "--baseline", "{url}", "--eval-set", "{path}"], ".jsonl",
     ("missing", "directory", "random")),
    ("bench_live_server", ["bench", "live", "--baseline", "{url}", "--samples", "2", "--repeats", "1",
                           "--warmup", "0", "--concurrency", "1"], "", ("dead_server",)),
    ("bench_specdec_draft", ["bench", "specdec", "--target", "tiny", "--draft", "{path}"], "",
     ("missing", "random")),
    ("bench_specdec_eval", ["bench", "specdec", "--target", "tiny", "--draft", "{tmp}", "--eval-set", "{path}"],
     ".jsonl", ("missing", "directory", "random")),
    ("bench_sglang", ["bench", "sglang", "--draft", "{path}", "--python", sys.executable], "", ("missing",)),
]

# Who owns each command's faults in issue 19: this branch (f19c) or another one.
OWNER = {"regenerate": "f19a", "monitor": "f19a", "bench_client": "f19a", "bench_generate": "f19a",
         "export": "f19b", "export_validate": "f19b", "doctor_draft": "f19b", "doctor_server_info": "f19b",
         "doctor_probe": "f19b"}
# Cases of other branches that still fail on this one (the merge removes the marks that no longer apply).
STILL_FAILING: set[str] = set()


def _cases():
    for name, argv, suffix, faults in COMMANDS:
        for fault in faults:
            case = f"{name}-{fault}"
            marks = ()
            if case in STILL_FAILING and OWNER.get(name, "f19c") != "f19c":
                marks = (pytest.mark.xfail(strict=False, reason="fixed on branch f19a/f19b"),)
            yield pytest.param(argv, suffix, fault, id=case, marks=marks)


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
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1")
    try:
        return subprocess.run([sys.executable, "-m", "draftlab.cli", *args], capture_output=True, text=True,
                              timeout=TIMEOUT_S, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"no outcome within {TIMEOUT_S} s: draftlab {' '.join(args)}\n{exc.stdout}\n{exc.stderr}")


@pytest.mark.parametrize(("argv", "suffix", "fault"), list(_cases()))
def test_fault_gives_one_line_error(argv, suffix, fault, tmp_path, request):
    proc = run_case(argv, suffix, fault, tmp_path)
    output = proc.stdout + proc.stderr
    if os.environ.get("DRAFTLAB_FAULTS_LOG"):  # the before/after counts of the closing note
        with open(os.environ["DRAFTLAB_FAULTS_LOG"], "a") as fh:
            fh.write(json.dumps({"case": request.node.callspec.id, "rc": proc.returncode,
                                 "traceback": "Traceback" in output}) + "\n")
    assert "Traceback" not in output, output[-3000:]
    assert proc.returncode != 0, output[-3000:]
