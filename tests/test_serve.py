"""draftlab.core.serve: the local transformers server's life cycle and the SGLang launch strings."""

import json
import socket

import httpx
import pytest

from draftlab.core import serve
from draftlab.sglang import commands
from draftlab.sglang.launch import parse_launch
from helpers_regen import group_gone, tiny_folder


def test_free_port_is_bindable():
    port = serve.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_sglang_commands_share_max_running_requests():
    cmds = commands.sglang_commands("/models/target", "/drafts/eagle3", max_running_requests=64, num_steps=5, topk=1)
    base, spec = parse_launch(cmds["baseline"]), parse_launch(cmds["eagle3"])
    assert base.max_running_requests == spec.max_running_requests == 64
    assert not base.is_speculative and spec.speculative_algorithm == "EAGLE3"
    assert spec.draft_model_path == "/drafts/eagle3" and spec.model_path == "/models/target"
    assert spec.num_steps == 5 and spec.eagle_topk == 1
    assert spec.num_draft_tokens == 6  # topk 1 forces steps + 1
    assert parse_launch(cmds["target"]).max_running_requests is None  # sized from memory
    ports = {c.split("--port ")[1].split()[0] for c in cmds.values()}
    assert len(ports) == 3  # the three can run side by side


def test_speculative_command_quotes_paths_and_checks_args():
    cmd = commands.sglang_speculative_command("/m/my target", "/d/x y", topk=4, num_draft_tokens=8)
    s = parse_launch(cmd)
    assert s.model_path == "/m/my target" and s.draft_model_path == "/d/x y"
    assert s.num_draft_tokens == 8 and s.max_running_requests == 48
    with pytest.raises(ValueError, match="num_draft_tokens"):
        commands.sglang_speculative_command("/m", "/d", topk=2)
    with pytest.raises(ValueError, match="EAGLE3 or EAGLE"):
        commands.sglang_speculative_command("/m", "/d", algorithm="MEDUSA")


def test_local_server_rejects_a_folder_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        serve.LocalServer(tmp_path, log_path=tmp_path / "serve.log")


@pytest.mark.server
def test_tiny_server_serves_and_stops(tmp_path):
    log = tmp_path / "logs" / "serve.log"
    with serve.LocalServer(tiny_folder(), log_path=log) as srv:
        pid = srv.proc.pid
        assert srv.alive() and srv.base_url.startswith("http://127.0.0.1:")
        r = httpx.post(
            f"{srv.base_url}/v1/chat/completions",
            timeout=60,
            json={"model": srv.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        )
        body = r.json()
        assert r.status_code == 200, body
        assert body["usage"]["completion_tokens"] == 4
        assert body["choices"][0]["finish_reason"] == "length"
    assert group_gone(pid), "server process group still running after the with block"
    text = log.read_text()
    assert "transformers" in text and "serve" in text and "/v1/chat/completions" in text
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{srv.base_url}/health", timeout=2)


@pytest.mark.server
def test_server_is_stopped_when_the_body_fails(tmp_path):
    srv = serve.LocalServer(tiny_folder(), log_path=tmp_path / "serve.log")
    with pytest.raises(RuntimeError, match="boom"):
        with srv:
            pid = srv.proc.pid
            raise RuntimeError("boom")
    assert group_gone(pid) and not srv.alive()


@pytest.mark.server
def test_failed_start_leaves_nothing_running(tmp_path):
    # a folder whose config names no known architecture: the server cannot load it
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "no-such-model"}))
    srv = serve.LocalServer(bad, log_path=tmp_path / "serve.log", startup_timeout=60)
    with pytest.raises(serve.ServerStartError) as err:
        srv.start()
    assert "serve.log" in str(err.value)
    assert srv.proc is None and group_gone(srv.pid)
    # and a server that is slower than its start-up timeout is killed, not left behind
    slow = serve.LocalServer(tiny_folder(), log_path=tmp_path / "slow.log", startup_timeout=0.5)
    with pytest.raises(serve.ServerStartError, match="within"):
        slow.start()
    assert slow.proc is None and group_gone(slow.pid)


@pytest.mark.server
def test_transformers_serve_dies_with_a_sigkilled_parent(tmp_path):
    """Issue 19.2: `kill -9` of the process that started `transformers serve` took the server with it
    only by luck before; now the kernel stops it (PR_SET_PDEATHSIG, core.process)."""
    import signal
    import subprocess
    import sys
    import textwrap

    parent = textwrap.dedent(f"""
        import time
        from draftlab.core.serve import LocalServer
        srv = LocalServer({str(tiny_folder())!r}, log_path={str(tmp_path / "serve.log")!r}, threads=1,
                          registry={str(tmp_path / "registry")!r}).start()
        print(srv.pid, flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    import time

    deadline = time.monotonic() + 15
    while not group_gone(child) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert group_gone(child) or open(f"/proc/{child}/stat").read().split()[2] == "Z", (
        "transformers serve outlived its SIGKILLed parent"
    )
