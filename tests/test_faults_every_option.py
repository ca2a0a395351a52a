"""Every numeric option of every command refuses a non-number and nan/inf in one line, exit 2.

The options are read from draftlab's own parsers (every command imported), so an option added later
is tried too. Range checks are the options' own (tests/test_faults_options.py, test_train_inputs.py);
this sweep holds the floor every option shares: no traceback, no usage block, no nan run.
"""

from __future__ import annotations

import argparse

import pytest

from draftlab import cli


def numeric_options():
    """(argv prefix naming the command, option string, kind) for every int/float-valued option."""
    parser = cli.build_parser([], lazy=False)
    found = []

    def walk(p: argparse.ArgumentParser, prefix: list[str]):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, prefix + [name])
            elif action.option_strings and action.type is not None and action.nargs in (None, "?"):
                kind = getattr(action.type, "__name__", "")
                if kind in ("int", "float", "number", "parse"):
                    found.append((prefix, action.option_strings[-1], kind))

    walk(parser, [])
    return found


OPTIONS = numeric_options()


def test_the_sweep_covers_every_command_with_numbers():
    commands = {" ".join(prefix) for prefix, _, _ in OPTIONS}
    assert {"train", "regenerate", "blend", "bench specdec", "bench sglang", "bench cost", "monitor"} <= commands
    assert len(OPTIONS) > 60


@pytest.mark.parametrize("bad", ["abc", "nan", "inf"])
@pytest.mark.parametrize("prefix,option,kind", OPTIONS, ids=[f"{' '.join(p)} {o}" for p, o, _ in OPTIONS])
def test_a_bad_number_is_one_line_and_exit_2(prefix, option, kind, bad, capsys):
    with pytest.raises(SystemExit) as stop:  # argparse stops at the bad value, before any work
        cli.main([*prefix, f"{option}={bad}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2, (prefix, option, bad, err)
    assert len(err) == 1 and err[0].startswith("error:") and option in err[0], err
