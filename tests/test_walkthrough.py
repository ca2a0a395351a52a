"""The newcomer's path (docs/your-own-target.md and the README's copy of it) runs as written.

The walkthrough's commands are read from the document itself: each parses with draftlab's own
parser, and their CPU twin (the random `tiny` target, demo sizes appended, no SGLang) runs from a
blend to a doctored draft in a fresh folder, so a renamed flag or a broken step fails here.

The section for a target too big for one process (hidden states captured in SGLang) is parsed, and
its steps checked to hand each other the same folders and flags, but not run: `capture-hidden`
starts an SGLang server of the target with a forward hook, which needs SGLang and a GPU, and there
is no CPU path through that command. Its CPU stand-in (the same store written by an adapter that
computes SGLang's states with transformers, then `train --hidden sglang` from it) is
tests/test_sglang_hidden.py and tests/test_sglang_hidden_train.py.
"""

from __future__ import annotations

import argparse
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


def bash_block(path: Path, marker: str) -> str:
    """The document's first bash block that contains `marker`."""
    return next(b for b in re.findall(r"```bash\n(.*?)```", path.read_text(), re.S) if marker in b)


def commands(block: str, variables: dict[str, str]) -> list[list[str]]:
    """The block's `.venv/bin/draftlab` commands as argv lists, `$NAME`s replaced (longest name first)."""
    joined = re.sub(r"\\\n\s*", " ", block)  # continuation lines
    lines = [ln.split(" #")[0].strip() for ln in joined.splitlines()]
    names = sorted(variables, key=len, reverse=True)

    def expand(arg: str) -> str:
        for name in names:
            arg = arg.replace("$" + name, variables[name])
        return arg

    return [[expand(arg) for arg in shlex.split(ln)[1:]] for ln in lines if ln.startswith(".venv/bin/draftlab ")]


def walkthrough(path: Path, target: str) -> list[list[str]]:
    """The `draftlab` commands of the document's walkthrough block (the bash block that starts from
    `draftlab target`), `$T` replaced, as argv lists."""
    return commands(bash_block(path, "draftlab target"), {"T": target})


def sglang_section(path: Path, target: str) -> list[list[str]]:
    """The commands of the section for a target only SGLang serves, `$T` and `$SGLANG_ARGS` replaced
    (the latter by the value the block itself assigns)."""
    block = bash_block(path, "draftlab capture-hidden")
    assigned = re.search(r'^SGLANG_ARGS="([^"]*)"', block, re.M)
    assert assigned, "the SGLang section assigns SGLANG_ARGS before using it"
    return commands(block, {"T": target, "SGLANG_ARGS": assigned.group(1)})


def test_the_readme_and_the_walkthrough_give_the_same_commands():
    doc = walkthrough(DOC, TARGET)
    assert [argv[0] for argv in doc] == ["target", "blend", "regenerate", "regenerate", "train", "doctor", "bench"]
    assert walkthrough(ROOT / "README.md", TARGET) == doc


EVERY_COMMAND = walkthrough(DOC, TARGET) + sglang_section(DOC, TARGET)


def parse(argv: list[str]):
    """draftlab's own parse of argv, and every `--flag` in it spelled in full: argparse would also take a
    prefix of a flag (`--val-fil`), which a reader copying the command should not be shown."""
    parser = cli.build_parser(argv)
    args = parser.parse_args(argv)
    for word in argv:  # down to the command's own parser (`bench sglang`: two levels)
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or word not in subs[0].choices:
            break
        parser = subs[0].choices[word]
    known = set(parser._option_string_actions)
    unknown = [a.split("=")[0] for a in argv if a.startswith("--") and a.split("=")[0] not in known]
    assert not unknown, f"draftlab {argv[0]}: {unknown} are not its flags as spelled"
    return args


@pytest.mark.parametrize("argv", EVERY_COMMAND, ids=lambda a: " ".join(a[:2]))
def test_every_walkthrough_command_parses(argv):
    assert callable(parse(argv).func)


@pytest.mark.parametrize(
    "argv", [a for a in EVERY_COMMAND if any(x.startswith("--") for x in a)], ids=lambda a: " ".join(a[:2])
)
def test_a_misspelled_flag_in_any_command_fails_to_parse(argv):
    """The parse test bites: each flag of each command, with a letter added or its last one dropped, is
    refused (an unknown flag exits 2; a prefix argparse would accept fails the spelling check)."""
    for i in [i for i, a in enumerate(argv) if a.startswith("--")]:
        name, eq, value = argv[i].partition("=")
        for wrong in (name + "x", name[:-1]):
            bad = [*argv[:i], wrong + eq + value, *argv[i + 1 :]]
            with pytest.raises((SystemExit, AssertionError)):
                parse(bad)


def test_the_sglang_section_captures_trains_exports_and_doctors_one_store():
    """Its steps agree: training reads the folder the capture wrote (--out-dir's ../hidden) with the
    same conversations (max_len, overlong, val samples, token cache) and launch flags; the draft
    exported is the one the doctor checks under a launch line with the same flags."""
    from draftlab.train_draft.cli import config_from_args

    capture, train, export, doctor = sglang_section(DOC, TARGET)
    assert [capture[0], train[0], export[0], doctor[0]] == ["capture-hidden", "train", "export", "doctor"]
    cap = parse(capture)
    argv = [str(ROOT / a) if a.startswith("recipes/") else a for a in train]
    cfg = config_from_args(parse(argv))
    assert cfg.hidden == "sglang" and cfg.target == cap.target == TARGET
    assert Path(cfg.out_dir).parent / "hidden" == Path(cap.out) and not cfg.hidden_dir
    assert "--tp-size" in cap.sglang_args and cfg.sglang_args == cap.sglang_args
    assert (cfg.train_file, cfg.val_file) == (cap.train_file, cap.val_file)
    assert (cfg.max_len, cfg.overlong, cfg.max_val_samples, cfg.max_train_samples or 0) == (
        cap.max_len,
        cap.overlong,
        cap.max_val_samples,
        cap.max_train_samples,
    )
    assert not cfg.token_cache and not cap.token_cache  # both: work/train/tokens
    exp = parse(export)
    assert Path(exp.checkpoint) == Path(cfg.out_dir) and exp.out == train[train.index("--export") + 1]
    doc = parse(doctor)
    assert doc.draft == exp.out and any(cap.sglang_args in line and "EAGLE3" in line for line in doc.launch)


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
