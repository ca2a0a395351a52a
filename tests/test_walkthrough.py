"""The newcomer's path (docs/your-own-target.md and the README's copy of it) runs as written.

The walkthrough's commands are read from the document itself: each parses with draftlab's own
parser, and their CPU twin (the random `tiny` target, demo sizes appended, no SGLang) runs from a
blend to a doctored draft in a fresh folder, so a renamed flag or a broken step fails here.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from draftlab import cli

ROOT = Path(__file__).parents[1]
DOC = ROOT / "docs" / "your-own-target.md"
TARGET = "meta-llama/Llama-3.1-8B-Instruct"

# what makes each step CPU-sized on the tiny target (appended: later flags win in argparse)
CPU_SIZES = {
    "blend": ["--total", "60"],
    "regenerate": ["--max-tokens", "48", "--truncation", "keep_flag", "--no-progress"],
    "train": [
        "--device",
        "cpu",
        "--epochs",
        "2",
        "--max-len",
        "128",
        "--batch-tokens",
        "1024",
        "--max-batch",
        "8",
        "--draft-vocab-size",
        "512",
        "--ttt-steps",
        "2",
    ],  # fmt: skip
}


def walkthrough(path: Path, target: str) -> list[list[str]]:
    """The `draftlab` commands of the document's walkthrough block (the bash block that starts from
    `draftlab target`), `$T` replaced, as argv lists."""
    block = next(b for b in re.findall(r"```bash\n(.*?)```", path.read_text(), re.S) if "draftlab target" in b)
    joined = re.sub(r"\\\n\s*", " ", block)  # continuation lines
    lines = [ln.split(" #")[0].strip() for ln in joined.splitlines()]
    return [
        [arg.replace("$T", target) for arg in shlex.split(ln)[1:]]
        for ln in lines
        if ln.startswith(".venv/bin/draftlab ")
    ]


def test_the_readme_and_the_walkthrough_give_the_same_commands():
    doc = walkthrough(DOC, TARGET)
    assert [argv[0] for argv in doc] == ["target", "blend", "regenerate", "regenerate", "train", "doctor", "bench"]
    assert walkthrough(ROOT / "README.md", TARGET) == doc


@pytest.mark.parametrize("argv", walkthrough(DOC, TARGET), ids=lambda a: " ".join(a[:2]))
def test_every_walkthrough_command_parses(argv):
    args = cli.build_parser(argv).parse_args(argv)
    assert callable(args.func)


def cpu_twin(argv: list[str]) -> list[str] | None:
    """The command on the tiny target at demo size; None for the SGLang benchmark (needs a GPU)."""
    if argv[0] == "bench":
        return None
    argv = [str(ROOT / a) if a.startswith(("params/", "recipes/")) else a for a in argv]
    if "--sglang-servers" in argv:  # SGLang servers need a GPU: transformers serve instead
        i = argv.index("--sglang-servers")
        del argv[i : i + 2]
    return argv + CPU_SIZES.get(argv[0], [])


@pytest.mark.slow
@pytest.mark.server
def test_the_walkthroughs_cpu_twin_runs_from_nothing_to_a_doctored_draft(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for argv in filter(None, map(cpu_twin, walkthrough(DOC, "tiny"))):
        proc = subprocess.run([sys.executable, "-m", "draftlab.cli", *argv], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        assert proc.returncode == 0, f"draftlab {' '.join(argv)}\n{proc.stderr[-3000:]}"
    draft = tmp_path / "work" / "drafts" / "eagle3"
    assert {p.name for p in draft.iterdir()} == {"config.json", "model.safetensors", "provenance.json"}
    assert "0 error(s)" in proc.stdout  # the last command is the doctor's
