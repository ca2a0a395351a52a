"""`draftlab --help` lists every command without importing a stage (issue 20.8: it took ~4 s, then 10 s
on a loaded 2-core machine, for torch), and every `draftlab train` option says what it does."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from draftlab import cli
from draftlab.train_draft.config import TrainConfig, field_comments


@pytest.mark.parametrize("argv", [["--help"], ["bench", "--help"]])
def test_the_lazy_listing_is_the_full_one(argv):
    """The help lines in cli.py's tables are the ones each command's module registers."""
    lazy, full = cli.build_parser(argv), cli.build_parser(argv, lazy=False)
    if argv[0] == "bench":
        lazy, full = (p._subparsers._group_actions[0].choices["bench"] for p in (lazy, full))
    assert lazy.format_help() == full.format_help()


def test_help_imports_no_stage_and_no_torch():
    code = (
        "import sys\nfrom draftlab import cli\ncli.build_parser(['--help']).format_help()\n"
        "cli.build_parser(['bench', '--help']).format_help()\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'pandas'))\n"
        "stages = sorted(m for m in sys.modules\n"
        "                if m.startswith('draftlab.') and m.split('.')[1] not in ('core', 'cli'))\n"
        "print(heavy, stages)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[] []", out


def test_a_chosen_command_still_gets_its_own_parser():
    args = cli.build_parser(["monitor", "w"]).parse_args(["monitor", "w"])
    assert args.command == "monitor" and args.func.__module__ == "draftlab.regenerate.cli"


def test_every_train_option_has_help_text():
    notes = field_comments()
    fields = [f.name for f in dataclasses.fields(TrainConfig)]
    assert [f for f in fields if not notes.get(f)] == [], "TrainConfig fields without a comment"
    train = cli.build_parser(["train"])._subparsers._group_actions[0].choices["train"]
    for action in train._actions:
        if action.dest in fields:
            assert action.help and notes[action.dest] in action.help and "default:" in action.help, action.dest
    assert "passes over the training conversations (default: 5.0)" in " ".join(train.format_help().split())
