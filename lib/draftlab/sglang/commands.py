"""Every SGLang launch line draftlab writes (contract section 4): the plain target server, the
speculative servers and the regeneration servers. The one place that builds them, so a new server
flag has one home; `draftlab.sglang.launch` parses them and `draftlab doctor` checks the same strings.
"""

from __future__ import annotations

import shlex

__all__ = [
    "COST_EXTRA",
    "REGEN_EXTRA",
    "REGEN_NCCL_OFFSET",
    "REGEN_POOL_TOKENS",
    "REGEN_RUNNING",
    "regeneration_command",
    "regeneration_commands",
    "cost_command",
    "sglang_commands",
    "sglang_speculative_command",
    "sglang_target_command",
    "launch_line",
]


def launch_line(flags) -> str:
    """`python -m sglang.launch_server` with these flags alone (e.g. a config file's, to parse as one command)."""
    return shlex.join(["python", "-m", "sglang.launch_server", *map(str, flags)])


def _sglang_base(
    model_path: str,
    *,
    host: str,
    port: int,
    tp: int,
    dtype: str | None,
    context_length: int | None,
    mem_fraction_static: float | None,
    max_running_requests: int | None,
    extra: tuple[str, ...],
) -> list[str]:
    cmd = [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model_path),
        "--host",
        host,
        "--port",
        str(port),
        "--tp",
        str(tp),
    ]
    if dtype:
        cmd += ["--dtype", dtype]
    if context_length:
        cmd += ["--context-length", str(context_length)]
    if mem_fraction_static:
        cmd += ["--mem-fraction-static", str(mem_fraction_static)]
    if max_running_requests:
        cmd += ["--max-running-requests", str(max_running_requests)]
    return cmd + list(extra)


def sglang_target_command(
    model_path: str,
    *,
    host: str = "127.0.0.1",
    port: int = 30000,
    tp: int = 1,
    dtype: str | None = "bfloat16",
    context_length: int | None = None,
    mem_fraction_static: float | None = None,
    max_running_requests: int | None = None,
    extra: tuple[str, ...] = (),
) -> str:
    """The plain target server (used for regeneration and as the speculative baseline)."""
    return shlex.join(
        _sglang_base(
            model_path,
            host=host,
            port=port,
            tp=tp,
            dtype=dtype,
            context_length=context_length,
            mem_fraction_static=mem_fraction_static,
            max_running_requests=max_running_requests,
            extra=extra,
        )
    )


def sglang_speculative_command(
    model_path: str,
    draft_path: str,
    *,
    algorithm: str = "EAGLE3",
    num_steps: int = 3,
    topk: int = 1,
    num_draft_tokens: int | None = None,
    max_running_requests: int = 48,
    host: str = "127.0.0.1",
    port: int = 30001,
    tp: int = 1,
    dtype: str | None = "bfloat16",
    context_length: int | None = None,
    mem_fraction_static: float | None = None,
    extra: tuple[str, ...] = (),
) -> str:
    """An EAGLE-family speculative server (contract §4).

    With topk == 1 SGLang forces num_draft_tokens = num_steps + 1, so we write that value.
    `max_running_requests` is always written: EAGLE caps it at 48 otherwise, and the baseline
    must get the same value for a fair comparison.
    """
    if algorithm not in ("EAGLE3", "EAGLE"):
        raise ValueError(f"algorithm must be EAGLE3 or EAGLE, got {algorithm!r}")
    if num_steps < 1 or topk < 1:
        raise ValueError("num_steps and topk must be >= 1")
    if topk == 1:
        num_draft_tokens = num_steps + 1
    elif num_draft_tokens is None:
        raise ValueError("num_draft_tokens is required when topk > 1")
    cmd = _sglang_base(
        model_path,
        host=host,
        port=port,
        tp=tp,
        dtype=dtype,
        context_length=context_length,
        mem_fraction_static=mem_fraction_static,
        max_running_requests=max_running_requests,
        extra=(),
    )
    cmd += [
        "--speculative-algorithm",
        algorithm,
        "--speculative-draft-model-path",
        str(draft_path),
        "--speculative-num-steps",
        str(num_steps),
        "--speculative-eagle-topk",
        str(topk),
        "--speculative-num-draft-tokens",
        str(num_draft_tokens),
    ]
    return shlex.join(cmd + list(extra))


def sglang_commands(
    model_path: str,
    draft_path: str,
    *,
    max_running_requests: int = 48,
    num_steps: int = 3,
    topk: int = 1,
    num_draft_tokens: int | None = None,
    host: str = "127.0.0.1",
    port: int = 30000,
    tp: int = 1,
    dtype: str | None = "bfloat16",
    context_length: int | None = None,
    mem_fraction_static: float | None = None,
) -> dict[str, str]:
    """The three servers of a study: `target` (regeneration), `baseline` and `eagle3`.

    baseline and eagle3 get the same `--max-running-requests` and adjacent ports so they can
    run side by side for a same-batch comparison.
    """
    common = dict(host=host, tp=tp, dtype=dtype, context_length=context_length, mem_fraction_static=mem_fraction_static)
    return {
        "target": sglang_target_command(model_path, port=port, **common),
        "baseline": sglang_target_command(
            model_path, port=port + 1, max_running_requests=max_running_requests, **common
        ),
        "eagle3": sglang_speculative_command(
            model_path,
            draft_path,
            algorithm="EAGLE3",
            num_steps=num_steps,
            topk=topk,
            num_draft_tokens=num_draft_tokens,
            max_running_requests=max_running_requests,
            port=port + 2,
            **common,
        ),
    }


# One SGLang server of a small target is bound by its scheduler, not the GPU: on one H200 the 135M
# target gave 15.4K output tok/s at 1,024 running requests (past the CUDA graphs), 28.7K at 512 (the
# graph limit) and 56.7K with two such servers (dev/LOG.md).
REGEN_RUNNING = 512  # --max-running-requests = --cuda-graph-max-bs: every decode batch graphed
REGEN_POOL_TOKENS = 600_000  # KV pool per server: fixed, so servers started together all fit
REGEN_NCCL_OFFSET = 1000  # torch.distributed's port: its own per server (EADDRINUSE otherwise)


REGEN_EXTRA = ("--attention-backend", "triton", "--sampling-backend", "pytorch", "--grammar-backend", "none")


def regeneration_command(
    model_path: str,
    *,
    port: int = 30000,
    mem_fraction_static: float = 0.5,
    max_running_requests: int = REGEN_RUNNING,
    cuda_graph_max_bs: int | None = None,
    max_total_tokens: int | None = None,
    nccl_port: int | None = None,
) -> str:
    """The launch command of one regeneration server of the target: wide batches, CUDA graphs up to
    `cuda_graph_max_bs` requests (default: `max_running_requests`, every decode batch graphed);
    `max_total_tokens` fixes its KV pool and `nccl_port` its torch.distributed port (for servers that
    share a GPU)."""
    extra = (
        *REGEN_EXTRA,
        "--cuda-graph-max-bs",
        str(cuda_graph_max_bs or max_running_requests),
        *(("--max-total-tokens", str(max_total_tokens)) if max_total_tokens else ()),
        *(("--nccl-port", str(nccl_port)) if nccl_port else ()),
    )
    return sglang_target_command(
        model_path,
        port=port,
        mem_fraction_static=mem_fraction_static,
        max_running_requests=max_running_requests,
        extra=extra,
    )


def regeneration_commands(
    model_path: str, count: int, *, port: int = 30000, mem_fraction_static: float = 0.5
) -> list[str]:
    """Launch commands for `count` target servers that share one GPU, on ports port .. port+count-1.

    SGLang 0.5.17 refuses a fraction below the share of GPU memory already taken when it starts,
    so the pool is bounded by --max-total-tokens and every server gets the same generous fraction."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    return [
        regeneration_command(
            model_path,
            port=port + i,
            mem_fraction_static=mem_fraction_static,
            max_total_tokens=REGEN_POOL_TOKENS,
            nccl_port=port + REGEN_NCCL_OFFSET + i,
        )
        for i in range(count)
    ]


# `draftlab bench cost`: servers of random-weight models (no tokenizer needed; requests send token ids).
COST_EXTRA = ("--skip-tokenizer-init",)


def cost_command(
    model_path: str,
    draft_path: str | None = None,
    *,
    num_steps: int = 3,
    topk: int = 1,
    num_draft_tokens: int | None = None,
    max_running_requests: int = 64,
    port: int = 30000,
    mem_fraction_static: float | None = None,
    dummy_weights: bool = False,
    extra: tuple[str, ...] = (),
) -> str:
    """One server of the cycle-cost bench: the plain target (draft_path None) or an EAGLE-3 server,
    every one with the same --max-running-requests and CUDA graphs up to it; `dummy_weights`: SGLang
    makes the target's random weights itself (--load-format dummy, nothing read from disk), the
    draft's are still read from its folder."""
    flags = (
        *COST_EXTRA,
        "--cuda-graph-max-bs",
        str(max_running_requests),
        *(("--load-format", "dummy") if dummy_weights else ()),
        # the draft would follow --load-format; its d2t map must be the exported one
        *(("--speculative-draft-load-format", "auto") if dummy_weights and draft_path else ()),
        *extra,
    )
    common = dict(port=port, mem_fraction_static=mem_fraction_static, max_running_requests=max_running_requests)
    if draft_path is None:
        return sglang_target_command(model_path, extra=flags, **common)
    return sglang_speculative_command(
        model_path,
        draft_path,
        num_steps=num_steps,
        topk=topk,
        num_draft_tokens=num_draft_tokens,
        extra=flags,
        **common,
    )
