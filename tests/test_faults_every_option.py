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


# Paths and URLs of the commands whose own fault tables do not try them (blend, regenerate, monitor, train,
# export and doctor have theirs): a missing path is bad input (2), a server that is not there cannot go on (1).
PATHS_AND_URLS = [
    (["bench", "specdec", "--draft", "/nope", "--target", "tiny"], 2, "--draft /nope"),
    (["bench", "live", "--baseline", "http://127.0.0.1:1", "--spec", "a=http://127.0.0.1:1"], 1, "127.0.0.1:1"),
    (["bench", "sglang", "--model-path", "/nope", "--draft", "/nope", "--out", "OUT"], 2, "/nope"),
    (["bench", "cost", "/nope/config.json", "--out", "OUT"], 2, "/nope/config.json"),
    (["bench", "client", "--base-url", "http://127.0.0.1:1", "--model", "m"], 1, "127.0.0.1:1"),
    (["capture-hidden", "--target", "/nope", "--train-file", "/nope.jsonl", "--out", "OUT"], 2, "/nope"),
    (["target", "/nope"], 2, "/nope"),
    (["sglang", "bundle", "--version", "0.5.17", "--out", "OUT", "--machine-packages", "/nope.txt"], 2, "/nope.txt"),
    (["run", "99"], 2, "'99'"),
]


@pytest.mark.parametrize("argv,code,named", PATHS_AND_URLS, ids=[" ".join(a[:2]) for a, _, _ in PATHS_AND_URLS])
def test_a_missing_path_or_absent_server_is_one_line(tmp_path, argv, code, named):
    import subprocess
    import sys

    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    proc = subprocess.run([sys.executable, "-m", "draftlab.cli", *argv], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == code, proc.stderr
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in proc.stderr, lines
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # nothing half-made
