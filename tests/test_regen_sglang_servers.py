"""Regeneration over several SGLang target servers on one GPU (sglang.server.TargetServers): the launch
commands that let them share it, and their life cycle as real processes (a health-check fixture runs
in place of `python -m sglang.launch_server`, which needs a GPU)."""

import argparse
import os
import shlex
import stat
import sys
from pathlib import Path

import pytest

from draftlab.core.errors import InputError
from draftlab.core.process import ServerStartError
from draftlab.core.serve import free_port_run
from draftlab.regenerate import cli
from draftlab.sglang.commands import REGEN_RUNNING, regeneration_commands
from draftlab.sglang.server import TargetServers

HEALTH = Path(__file__).parent / "helpers_sglang" / "health_server.py"


def _flags(cmd: str) -> dict[str, str]:
    argv = shlex.split(cmd)
    return {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--")}


def test_servers_that_share_a_gpu_get_their_own_ports_a_fixed_pool_and_graphed_batches():
    cmds = regeneration_commands("/m/target", 3, port=30000)
    flags = [_flags(c) for c in cmds]
    assert [f["--port"] for f in flags] == ["30000", "30001", "30002"]
    assert len({f["--nccl-port"] for f in flags} | {f["--port"] for f in flags}) == 6  # no port twice
    for f in flags:
        # every decode batch inside the CUDA graphs: 15.4K tok/s at 1,024 running, 28.7K at 512 (H200)
        assert f["--max-running-requests"] == f["--cuda-graph-max-bs"] == str(REGEN_RUNNING)
        assert int(f["--max-total-tokens"]) > 0 and f["--mem-fraction-static"] == "0.5"
        assert f["--model-path"] == "/m/target"
    with pytest.raises(ValueError):
        regeneration_commands("/m/target", 0)


def _fake_python(tmp_path: Path, *extra: str) -> str:
    """An interpreter stand-in that runs the health fixture on the launch command's --port."""
    script = tmp_path / "python-fixture"
    script.write_text(
        '#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = --port ] && port=$2; shift; done\n'
        f'exec {shlex.quote(sys.executable)} {shlex.quote(str(HEALTH))} "$port" {" ".join(extra)}\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_free_port_run_skips_a_port_whose_next_one_is_taken(monkeypatch):
    """The group's ports are PORT .. PORT + count - 1: a candidate whose next port is held is passed over."""
    import socket

    from draftlab.core import serve

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        # the held port's neighbour first, then real free ports (one picked ahead of time had its own next port
        # taken once in a full run: StopIteration on a third candidate)
        real, candidates = serve.free_port, iter([taken - 1])
        monkeypatch.setattr(serve, "free_port", lambda host="127.0.0.1": next(candidates, None) or real(host))
        port = serve.free_port_run(2)
        assert port != taken - 1 and taken not in (port, port + 1)
        with pytest.raises(OSError, match="no 2 consecutive free ports on 127.0.0.1 in 1 tries"):
            monkeypatch.setattr(serve, "free_port", lambda host="127.0.0.1": taken - 1)
            serve.free_port_run(2, tries=1)


def test_target_servers_start_together_answer_on_their_urls_and_all_stop(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTLAB_SERVER_REGISTRY", str(tmp_path / "registry"))
    port = free_port_run(2)
    group = TargetServers(
        "/m/target", 2, tmp_path / "logs", port=port, python=_fake_python(tmp_path), startup_timeout=20
    )
    with group as servers:
        assert servers.urls == [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]
        assert servers.model == "/m/target"  # the `model` field requests carry: the served folder
        assert all(s.alive() for s in servers.servers) and servers.startup_s > 0
        pids = [s.pid for s in servers.servers]
    assert all(_gone(p) for p in pids)
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["sglang-0.log", "sglang-1.log"]


def test_one_server_that_never_gets_healthy_stops_the_others_too(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTLAB_SERVER_REGISTRY", str(tmp_path / "registry"))
    group = TargetServers(
        "/m/target",
        2,
        tmp_path / "logs",
        port=free_port_run(2),
        python=_fake_python(tmp_path, "--ready-after", "600"),
        startup_timeout=2,
    )
    with pytest.raises(ServerStartError):
        with group:
            pass
    assert all(_gone(s.pid) for s in group.servers)


def test_sglang_servers_needs_a_target_to_serve(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    parser = argparse.ArgumentParser()
    cli.add_regenerate_parser(parser.add_subparsers())
    args = parser.parse_args(
        [
            "regenerate",
            str(rows),
            str(tmp_path / "work"),
            "--base-url",
            "http://127.0.0.1:1",
            "--model",
            "m",
            "--sglang-servers",
            "2",
        ]
    )
    with pytest.raises(InputError, match="--sglang-servers 2: needs --serve TARGET"):
        cli._check_args(args)
