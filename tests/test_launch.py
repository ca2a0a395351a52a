"""Parsing SGLang launch commands back into flags (draftlab.sglang.launch)."""

import pytest

from draftlab.sglang.commands import sglang_commands, sglang_speculative_command
from draftlab.sglang.launch import (
    LaunchError,
    from_server_info,
    parse_launch,
    remove_flag,
    set_flag,
    split_command,
)


def test_parse_full_command_with_env_equals_and_continuations():
    cmd = (
        "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 CUDA_VISIBLE_DEVICES=0 python3 -m sglang.launch_server \\\n"
        "  --model-path deepseek-ai/DeepSeek-V3 --tp 8 --speculative-algorithm=eagle3 \\\n"
        "  --speculative-draft-model-path '/models/my draft' --speculative-num-steps 3 \\\n"
        "  --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 --context-length 32768 --trust-remote-code"
    )
    s = parse_launch(cmd)
    assert s.env == {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1", "CUDA_VISIBLE_DEVICES": "0"}
    assert s.model_path == "deepseek-ai/DeepSeek-V3"
    assert s.speculative_algorithm == "EAGLE3"  # upper-cased as SGLang does
    assert s.draft_model_path == "/models/my draft"
    assert (s.num_steps, s.eagle_topk, s.num_draft_tokens, s.context_length) == (3, 1, 4, 32768)
    assert s.max_running_requests is None and s.effective_max_running_requests == 48
    assert "--trust-remote-code" in s.unknown and "--tp" in s.unknown


def test_parse_abbreviations_and_sglang_serve_form():
    s = parse_launch("sglang serve --model /m --speculative-algo EAGLE --speculative-draft-model-path /d")
    assert s.model_path == "/m" and s.speculative_algorithm == "EAGLE" and s.draft_model_path == "/d"
    base = parse_launch("python -m sglang.launch_server --model-path /m --port 30001")
    assert not base.is_speculative and base.effective_max_running_requests is None  # sized from memory
    only_flags = parse_launch("--speculative-algorithm EAGLE3 --max-running-requests 64")
    assert only_flags.speculative_algorithm == "EAGLE3" and only_flags.max_running_requests == 64


def test_parse_strings_built_by_draftlab_serve():
    cmds = sglang_commands("/models/target", "/models/draft", max_running_requests=32, num_steps=5)
    spec = parse_launch(cmds["eagle3"])
    assert spec.speculative_algorithm == "EAGLE3" and spec.draft_model_path == "/models/draft"
    assert (spec.num_steps, spec.eagle_topk, spec.num_draft_tokens, spec.max_running_requests) == (5, 1, 6, 32)
    baseline = parse_launch(cmds["baseline"])
    assert not baseline.is_speculative and baseline.max_running_requests == 32
    assert baseline.model_path == spec.model_path == "/models/target"


def test_set_flag_replaces_abbreviations_and_equals_forms_and_appends():
    cmd = sglang_speculative_command("/t", "/d", algorithm="EAGLE")
    fixed = set_flag(cmd, "--speculative-algorithm", "EAGLE3")
    assert parse_launch(fixed).speculative_algorithm == "EAGLE3"
    assert fixed.count("--speculative-algorithm") == 1 and "/d" in fixed
    assert (
        set_flag("x --speculative-algo=EAGLE --port 1", "--speculative-algorithm", "EAGLE3")
        == "x --speculative-algorithm EAGLE3 --port 1"
    )
    assert set_flag("python -m sglang.launch_server --model-path /t", "--max-running-requests", 48).endswith(
        "--max-running-requests 48"
    )
    assert remove_flag("a --context-length 10 --port 2", "--context-length") == "a --port 2"


def test_server_info_settings():
    s = from_server_info(
        {
            "model_path": "/t",
            "speculative_algorithm": "EAGLE",
            "speculative_num_steps": "3",
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 4,
            "max_running_requests": 48,
            "context_length": 4096,
        },
        "f.json",
    )
    assert s.speculative_algorithm == "EAGLE" and s.num_steps == 3 and s.context_length == 4096
    with pytest.raises(LaunchError, match="f.json: field 'speculative_num_steps'"):
        from_server_info({"speculative_num_steps": "three"}, "f.json")
    with pytest.raises(LaunchError, match="expected a JSON object"):
        from_server_info([1, 2], "f.json")


def test_bad_commands_give_one_line_errors():
    with pytest.raises(LaunchError, match="cannot split"):
        parse_launch("python -m sglang.launch_server --model-path 'unclosed")
    with pytest.raises(LaunchError, match="invalid int value"):
        parse_launch("python -m sglang.launch_server --speculative-num-steps three")
    env, args = split_command("A=1 env B=2 docker run img python -m sglang.launch_server --port 1")
    assert env == {"A": "1", "B": "2"} and args == ["--port", "1"]
