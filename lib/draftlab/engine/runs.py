"""Runs of the engine over many prompts: encoding, summaries, graphed engines, greedy comparisons.

`compare` is what notebooks 05-07 call: the same prompts through plain greedy decoding and the
speculative engine, with acceptance (core.acceptance) and speed labelled as this engine's own.
"""

from __future__ import annotations

import warnings
import weakref
from dataclasses import asdict, replace

from draftlab.core.acceptance import acceptance_length
from draftlab.core.progress import tqdm
from draftlab.engine.runners import SpecConfig
from draftlab.engine.spec import PromptResult, SpecEngine, _sync
from draftlab.model.target import render_chat

# --------------------------------------------------------------------------- runs and summaries


def encode_prompts(target, prompts: list) -> list[list[int]]:
    """Chat prompts (lists of messages, or plain strings as one user turn) -> token ids.

    `target` is a Target or just its tokenizer: SGLang's /generate gets these same ids."""
    tokenizer = getattr(target, "tokenizer", target)
    out = []
    for p in prompts:
        messages = [{"role": "user", "content": p}] if isinstance(p, str) else p
        text = render_chat(tokenizer, messages, add_generation_prompt=True)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def summarize(results: list[PromptResult], num_steps: int | None = None) -> dict:
    """Token-weighted acceptance length, per-position rates, histogram, tokens/s (decode and total)."""
    tokens = sum(len(r.tokens) for r in results)
    verify = sum(r.verify_steps for r in results)
    decode_s = sum(r.decode_s for r in results)
    total_s = decode_s + sum(r.prefill_s for r in results)
    out = {
        "prompts": len(results),
        "completion_tokens": tokens,
        "verify_steps": verify,
        "decode_s": decode_s,
        "total_s": total_s,
        "tokens_per_s": tokens / total_s if total_s else None,
        # decode-only: tokens after the first over decode time (what the break-even model predicts)
        "decode_tokens_per_s": (tokens - len(results)) / decode_s if decode_s else None,
    }
    accepted = [a for r in results for a in r.accepted]
    if num_steps is not None:
        out["acceptance_length"] = acceptance_length(tokens, verify)
        out["mean_accepted_plus_one"] = (sum(accepted) / len(accepted) + 1) if accepted else None
        hist = [0] * (num_steps + 1)
        for a in accepted:
            hist[a] += 1
        out["accept_histogram"] = hist  # verify steps that accepted 0..S draft tokens
        # a_i = P(draft token i accepted | tokens < i accepted), i = 1..S (tree: depth i)
        out["position_acceptance"] = [
            (sum(1 for a in accepted if a >= i) / reached)
            if (reached := sum(1 for a in accepted if a >= i - 1))
            else None
            for i in range(1, num_steps + 1)
        ]
    return out


def run_prompts(
    engine: SpecEngine, prompt_ids: list[list[int]], speculative: bool, progress: bool = True, desc: str | None = None
) -> list[PromptResult]:
    fn = engine.speculative if speculative else engine.greedy
    return [
        fn(p) for p in tqdm(prompt_ids, desc=desc or ("speculative" if speculative else "greedy"), disable=not progress)
    ]


# drafts (or targets, when no draft) whose graph replay matched eager decoding; weak, so that a
# freed draft's id reused by a new one cannot skip the new one's check
_GRAPHS_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # draft -> drafting shapes checked


def graphed_engine(target, draft, config: SpecConfig, max_len: int, probe: list[int], prompt_lengths=()) -> SpecEngine:
    """An engine with its CUDA graphs captured (the prefills of prompts of `prompt_lengths` too),
    or an eager one when capture fails.

    The first engine of each draft and drafting shape also decodes `probe` both ways, greedily
    and speculatively, and falls back to eager if the replay differs (greedy tokens, or the number
    of draft tokens accepted beyond rounding), so a broken graph costs speed, never correctness or
    acceptance; the reason is kept in `engine.graph_error` and reported with the results."""
    engine = SpecEngine(target, draft, config, max_len=max_len)
    if not engine.use_graphs:
        return engine
    key = draft if draft is not None else target.model
    shape = (config.mode, config.num_steps, config.topk, config.num_draft_tokens, engine.prefill_bucket)
    try:
        engine.capture([len(probe), *prompt_lengths])
        if shape not in _GRAPHS_CHECKED.get(key, set()):
            decode = lambda: (engine.greedy(probe).tokens, sum(engine.speculative(probe).accepted) if draft else 0)  # noqa: E731
            graphed = decode()
            engine.use_graphs = False
            eager = decode()
            engine.use_graphs = True
            if graphed[0] != eager[0]:
                raise RuntimeError(f"graph replay decoded {graphed[0][:8]}... but eager decoding {eager[0][:8]}...")
            # a stale buffer in a draft graph would show as far fewer accepted tokens; allow rounding
            if abs(graphed[1] - eager[1]) > 0.02 * eager[1] + 1:
                raise RuntimeError(
                    f"graph replay accepted {graphed[1]} draft tokens on the probe, eager decoding {eager[1]}"
                )
            _GRAPHS_CHECKED.setdefault(key, set()).add(shape)
        return engine
    except Exception as exc:  # noqa: BLE001 - any capture failure means: run eagerly
        engine.close()
        _sync(engine.device)
        reason = f"{type(exc).__name__}: {exc}"[:300]
        warnings.warn(f"CUDA graphs off for this run ({reason})", stacklevel=2)
        engine = SpecEngine(target, draft, replace(config, cuda_graphs=False), max_len=max_len)
        engine.graph_error = reason
        return engine


def compare(
    target,
    draft,
    prompt_ids: list[list[int]],
    config: SpecConfig,
    eval_set: str = "prompts",
    greedy_results: list[PromptResult] | None = None,
    warmup: int = 1,
    progress: bool = True,
    max_len: int | None = None,
) -> dict:
    """Greedy vs speculative on the same prompts in the same engine: stats, speedup, losslessness."""
    need = max(len(p) for p in prompt_ids) + config.max_new_tokens + config.slots_after_root() + 2
    max_len = max(max_len or 0, need)
    engine = graphed_engine(target, draft, config, max_len, prompt_ids[0], [len(p) for p in prompt_ids])
    try:
        for p in prompt_ids[:warmup]:  # first-call costs outside the timed runs
            engine.greedy(p)
            engine.speculative(p)
        if greedy_results is None:
            greedy_results = run_prompts(engine, prompt_ids, False, progress, f"greedy ({eval_set})")
        spec = run_prompts(
            engine,
            prompt_ids,
            True,
            progress,
            f"{config.mode} S={config.num_steps} K={config.topk} D={config.num_draft_tokens} ({eval_set})",
        )
    finally:
        engine.close()
    g, s = summarize(greedy_results), summarize(spec, config.num_steps)
    same = sum(a.tokens == b.tokens for a, b in zip(greedy_results, spec))
    return {
        "eval_set": eval_set,
        "samples": len(prompt_ids),
        **{k: v for k, v in asdict(config).items() if k not in ("cuda_graphs", "prefill_bucket")},
        "prefill_bucket": engine.prefill_bucket,
        "device": str(engine.device),
        "dtype": str(engine.runner.dtype).replace("torch.", ""),
        "cuda_graphs": engine.use_graphs,
        **({"cuda_graphs_error": engine.graph_error} if engine.graph_error else {}),
        "greedy": g,
        "speculative": s,
        "acceptance_length": s["acceptance_length"],
        "speedup": (s["tokens_per_s"] / g["tokens_per_s"]) if g["tokens_per_s"] and s["tokens_per_s"] else None,
        "decode_speedup": (s["decode_tokens_per_s"] / g["decode_tokens_per_s"])
        if g["decode_tokens_per_s"] and s["decode_tokens_per_s"]
        else None,
        "identical_outputs": same,
        "lossless": same == len(prompt_ids),
        "_greedy_results": greedy_results,
    }


def public(result: dict) -> dict:
    """A compare() result without the raw per-prompt objects (for JSON / tables)."""
    return {k: v for k, v in result.items() if not k.startswith("_")}


def chain_sweep(
    target,
    draft,
    prompt_ids,
    steps=range(1, 8),
    mode: str = "EAGLE3",
    max_new_tokens: int = 128,
    eval_set: str = "prompts",
    progress: bool = True,
    cuda_graphs: bool | None = None,
    prefill_bucket: int | None = None,
) -> list[dict]:
    """Chain acceptance and speedup for S = 1..7 (greedy decoded once and reused)."""
    rows, greedy = [], None
    for s in steps:
        cfg = SpecConfig(
            mode=mode,
            num_steps=s,
            topk=1,
            max_new_tokens=max_new_tokens,
            cuda_graphs=cuda_graphs,
            prefill_bucket=prefill_bucket,
        )
        res = compare(
            target,
            draft,
            prompt_ids,
            cfg,
            eval_set,
            greedy_results=greedy,
            progress=progress,
            warmup=1 if greedy is None else 0,
        )
        greedy = res["_greedy_results"]
        rows.append(public(res))
    return rows
