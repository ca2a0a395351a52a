"""`draftlab prompts generate`: broad training prompts written by the target itself, without a hub.

Why: a draft must see the target's own outputs on the kinds of request it will serve, and the only
offline prompt source besides this was docstrings of installed packages. Following Magpie (Xu et al.,
2024), the target is given its chat template up to the start of a user turn (system prompt included)
as raw text on an OpenAI-compatible `/v1/completions` endpoint, sampled at temperature, and writes a
user turn; what it writes until its end-of-turn marker is the prompt. The same servers as
regeneration serve it (`transformers serve` on a CPU, SGLang on a GPU; `--serve TARGET` starts them for the
run, `--base-url` names running ones, attempts spread over them in turn). With `--follow-ups FILE`
(conversations already answered, e.g. by `draftlab regenerate`) the prefix is the whole conversation,
and the target writes the next user turn: multi-turn prompts. With `--opening TEXT` (repeatable) a user turn
starts with that text and the target continues it: a small target follows an opening ("Write a Python
function that") where it only paraphrases a system prompt that describes the user.

Each turn is screened (prompt_filter: length, language, refusals, repeated n-grams, assistant
leakage), deduplicated (exact and MinHash near-duplicates), and decontaminated against every
evaluation set (eval_sets.all_eval_texts); kept ones are canonical conversations ready for
`draftlab regenerate`, refused ones go to OUT.rejects.jsonl with their reason. OUT.state.json holds
the settings and the attempts made: a rerun continues the same job, or refuses other settings.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from draftlab.core.errors import InputError, RunFailure
from draftlab.core.files import atomic_write_json
from draftlab.core.options import number
from draftlab.core.overlap import EvalIndex
from draftlab.core.progress import tqdm
from draftlab.core.records import RecordError, append_jsonl, conversation_id, read_jsonl
from draftlab.core.serve import require_reachable
from draftlab.core.stop import graceful_stop
from draftlab.dataset_discovery.eval_sets import all_eval_texts
from draftlab.dataset_discovery.prompt_filter import FilterConfig, reason_kind, screen
from draftlab.model.target import load_tokenizer
from draftlab.sglang.server import serve_target

SENTINEL = "\u2063draftlab-user-turn\u2063"  # stands for the user turn while the template is rendered
RETRIES = 3
# `transformers serve` samples only if the model's generation config says do_sample, whatever the request's
# temperature; it takes generation settings as this JSON string. A server that refuses the field (4xx) is
# asked again without it, and never again in the run.
SAMPLE_FIELD = {"generation_config": json.dumps({"do_sample": True})}


@dataclass
class GenConfig:
    """One generation job; every field but the server, the count and the concurrency must match on resume."""

    base_urls: list[str]
    model: str
    n: int
    out: str
    tokenizer: str | None = None  # default: --model (a folder or a draftlab target spec)
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    seed: int = 0
    system: str | None = None  # a system prompt; None: the template's own default, if any
    # texts a user turn starts with, one per attempt in turn, kept as the turn's start: a small target follows an
    # opening ("Write a Python function that") far better than a system prompt that describes the user
    openings: tuple[str, ...] = ()
    follow_ups: str | None = None  # answered conversations whose next user turn is written
    concurrency: int = 8
    max_attempts: int = 20  # per prompt wanted: a run that keeps too few stops instead of spinning
    timeout_s: float = 300.0
    filters: FilterConfig = field(default_factory=FilterConfig)


# ------------------------------------------------------------------------------- the prefixes


def template_parts(tokenizer, history: list[dict] = (), system: str | None = None) -> tuple[str, str]:
    """(the rendered chat template up to where a user turn's text starts, the text that ends a user turn)."""
    messages = ([{"role": "system", "content": system}] if system else []) + list(history)
    messages.append({"role": "user", "content": SENTINEL})
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    if SENTINEL not in text:
        raise InputError("the tokenizer's chat template drops the user turn's text; it cannot prefix a user turn")
    prefix, suffix = text.split(SENTINEL, 1)
    end = suffix.strip() or (tokenizer.eos_token or "")
    if not end:
        raise InputError("the chat template marks no end of a user turn and the tokenizer has no eos token")
    return prefix, end


def histories(path: str | None) -> list[list[dict]]:
    """[[]] (first turns), or the answered conversations of --follow-ups (each ends with an assistant turn)."""
    if path is None:
        return [[]]
    rows = []
    for i, row in enumerate(read_jsonl(path, skip_torn_tail=False)):
        messages = row.get("messages") if isinstance(row, dict) else None
        if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
            raise RecordError(f"--follow-ups {path}: row {i + 1}: field 'messages' is not a list of turns")
        if messages[-1].get("role") != "assistant":
            raise RecordError(f"--follow-ups {path}: row {i + 1}: messages[-1] is not an assistant turn")
        rows.append([{"role": m["role"], "content": m["content"]} for m in messages])
    if not rows:
        raise RecordError(f"--follow-ups {path}: no conversations")
    return rows


# --------------------------------------------------------------------------------- the server


async def _complete(client: httpx.AsyncClient, url: str, body: dict, extra: dict) -> tuple[str, str | None]:
    """(text, finish_reason) of one /v1/completions request; transient failures retried, then RunFailure.
    `extra` (SAMPLE_FIELD, or {} once a server refused it) is sent with the body."""
    for attempt in range(RETRIES):
        try:
            r = await client.post(f"{url}/v1/completions", json=body | extra)
            if extra and 400 <= r.status_code < 500:
                extra.clear()
                r = await client.post(f"{url}/v1/completions", json=body)
            if r.status_code < 500:
                break
            error = f"HTTP {r.status_code}"
        except httpx.TransportError as exc:
            error = f"{type(exc).__name__}: {exc}"
        await asyncio.sleep(2**attempt)
    else:
        raise RunFailure(f"{url}/v1/completions: {error} after {RETRIES} tries")
    if r.status_code != 200:
        raise RunFailure(f"{url}/v1/completions: HTTP {r.status_code}: {r.text[:200]}")
    try:
        choice = r.json()["choices"][0]
        return str(choice["text"]), choice.get("finish_reason")
    except (ValueError, KeyError, IndexError, TypeError):
        raise RunFailure(f"{url}/v1/completions: not an OpenAI completion ({r.text[:200]})") from None


async def _sample(cfg: GenConfig, prompts: list[tuple[int, str]], end: list[str]) -> list[tuple[int, str, str]]:
    """(attempt, text, finish) for each (attempt, prefix), at most cfg.concurrency in flight."""
    urls = [u.rstrip("/") for u in cfg.base_urls]
    sem = asyncio.Semaphore(cfg.concurrency)
    extra = dict(SAMPLE_FIELD) if cfg.temperature > 0 else {}

    async def one(client, attempt, prefix):
        body = {
            "model": cfg.model,
            "prompt": prefix,
            "max_tokens": cfg.max_tokens,
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "seed": cfg.seed * 1_000_003 + attempt,
            "stop": end,
        }
        async with sem:
            text, finish = await _complete(client, urls[attempt % len(urls)], body, extra)
        return attempt, text, finish

    async with httpx.AsyncClient(timeout=cfg.timeout_s) as client:
        return await asyncio.gather(*(one(client, a, p) for a, p in prompts))


# ---------------------------------------------------------------------------------- the job


class Job:
    """The output files of one generation job, the dedup and contamination indexes, and the counts."""

    def __init__(self, cfg: GenConfig, settings: dict, eval_texts: dict[str, str]):
        self.cfg, self.out = cfg, Path(cfg.out)
        self.rejects_path = self.out.with_name(self.out.name + ".rejects.jsonl")
        self.state_path = self.out.with_name(self.out.name + ".state.json")
        self.settings = settings
        self.attempts, self.reasons = 0, Counter()
        if self.state_path.is_file():
            state = json.loads(self.state_path.read_text())
            if state["settings"] != settings:
                changed = sorted(k for k in settings if state["settings"].get(k) != settings[k])
                raise RecordError(
                    f"{self.out}: made with other settings ({', '.join(changed)} differ); "
                    "rerun with the same settings to resume, or choose a new --out"
                )
            self.attempts, self.reasons = state["attempts"], Counter(state["reasons"])
        elif self.out.exists():
            raise RecordError(f"{self.out}: exists without {self.state_path.name}; choose a new --out")
        self.kept = list(read_jsonl(self.out)) if self.out.is_file() else []
        self.exact = {_norm_hash(r["messages"][-1]["content"]) for r in self.kept}
        self.near = EvalIndex(threshold=0.8)
        for r in self.kept:
            self.near.add(r["id"], r["messages"][-1]["content"])
        self.contamination = EvalIndex(eval_texts)

    def judge(self, text: str, finish: str | None, end: str, markers: tuple[str, ...]) -> tuple[str, str | None]:
        """(the user turn, why it is refused or None)."""
        if end in text:
            text = text[: text.index(end)]
        elif finish == "length":
            return text, f"no end of turn within {self.cfg.max_tokens} tokens"
        text = text.strip()
        reason = screen(text, self.cfg.filters, markers)
        if reason:
            return text, reason
        if _norm_hash(text) in self.exact:
            return text, "duplicate (exact)"
        signature = self.near.signature(text)
        twins = self.near.near(text, signature)
        if twins:
            return text, f"duplicate (near {sorted(twins)[0]})"
        hits = self.contamination.hits(text)
        if hits:
            return text, f"contaminated ({sorted(hits)[0]})"
        return text, None

    def save(self, kept: list[dict], rejects: list[dict]) -> None:
        """Rows first, then the state that counts them: a crash between the two only repeats attempts."""
        append_jsonl(self.out, kept, fsync=True)
        append_jsonl(self.rejects_path, rejects)
        self.kept += kept
        state = {"settings": self.settings, "attempts": self.attempts, "kept": len(self.kept),
                 "reasons": dict(self.reasons)}  # fmt: skip
        atomic_write_json(self.state_path, state, indent=1)


def opening(cfg: GenConfig, attempt: int, histories: int) -> str:
    """The text attempt `attempt` starts its user turn with: the openings in turn, one per pass over the
    histories (every history meets every opening); "" without openings."""
    return cfg.openings[(attempt // histories) % len(cfg.openings)] if cfg.openings else ""


def _norm_hash(text: str) -> str:
    return hashlib.blake2b(" ".join(text.lower().split()).encode("utf-8"), digest_size=12).hexdigest()


def _settings(cfg: GenConfig, prefixes: list[str]) -> dict:
    keep = {k: v for k, v in asdict(cfg).items() if k not in ("base_urls", "n", "out", "concurrency", "timeout_s")}
    keep["prefixes_sha256"] = hashlib.sha256("\x00".join(prefixes).encode()).hexdigest()
    return json.loads(json.dumps(keep))


def generate(cfg: GenConfig, tokenizer=None, eval_texts: dict[str, str] | None = None, progress: bool = True) -> dict:
    """Write cfg.n screened, deduplicated, decontaminated prompts to cfg.out (resuming); returns the counts."""
    if cfg.n < 1:
        raise InputError(f"--n {cfg.n}: ask for at least one prompt")
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(cfg.tokenizer or cfg.model)
    history = histories(cfg.follow_ups)
    parts = [template_parts(tokenizer, h, cfg.system) for h in history]
    markers = tuple(t for t in getattr(tokenizer, "all_special_tokens", []) if len(t) > 1)
    job = Job(cfg, _settings(cfg, [p for p, _ in parts]), all_eval_texts() if eval_texts is None else eval_texts)
    source = f"generated/{Path(cfg.model).name}"
    if len(job.kept) >= cfg.n:
        return _summary(job)
    if not cfg.base_urls:
        raise InputError("prompts generate: give --base-url URL (repeatable) or --serve TARGET")
    for url in cfg.base_urls:
        require_reachable(url)
    bar = tqdm(total=cfg.n, initial=len(job.kept), desc="prompts", unit="prompt", disable=not progress)
    with graceful_stop(f"rerun the same command to continue {cfg.out}") as stop:
        while len(job.kept) < cfg.n:
            if job.attempts >= cfg.n * cfg.max_attempts:
                top = ", ".join(f"{k} {v}" for k, v in Counter(map(reason_kind, job.reasons.elements())).most_common(3))
                raise RunFailure(f"{cfg.out}: {len(job.kept)} of {cfg.n} prompts kept after {job.attempts} attempts "
                                 f"(most refused: {top}); raise --max-attempts or relax the sampling")  # fmt: skip
            todo = [(a, parts[a % len(parts)][0] + opening(cfg, a, len(parts)))
                    for a in range(job.attempts, job.attempts + 2 * cfg.concurrency)]  # fmt: skip
            written = asyncio.run(_sample(cfg, todo, sorted({e for _, e in parts})))
            _check_sampling(cfg, written)
            results = [(a, opening(cfg, a, len(parts)) + text, finish) for a, text, finish in written]
            kept, rejects = [], []
            for attempt, text, finish in sorted(results):
                hist, (_, end) = history[attempt % len(history)], parts[attempt % len(parts)]
                turn, reason = job.judge(text, finish, end, markers)
                job.attempts = attempt + 1
                if reason is None and len(job.kept) + len(kept) < cfg.n:
                    messages = hist + [{"role": "user", "content": turn}]
                    meta = {"attempt": attempt, "generator": cfg.model, "temperature": cfg.temperature,
                            "top_p": cfg.top_p, "turn": len(hist) // 2 + 1, "finish_reason": finish}  # fmt: skip
                    if cfg.openings:
                        meta["opening"] = opening(cfg, attempt, len(parts))
                    row = {
                        "id": conversation_id(messages, source),
                        "source": source,
                        "messages": messages,
                        "meta": meta,
                    }
                    job.exact.add(_norm_hash(turn))
                    job.near.add(row["id"], turn)
                    kept.append(row)
                elif reason is not None:
                    job.reasons[reason_kind(reason)] += 1
                    rejects.append({"attempt": attempt, "reason": reason, "text": turn[:500]})
            job.save(kept, rejects)
            bar.update(len(kept))
            if stop:
                stop.stopped(f"prompts: {len(job.kept)} of {cfg.n} written to {cfg.out}")
    bar.close()
    return _summary(job)


def _check_sampling(cfg: GenConfig, results: list[tuple[int, str, str]]) -> None:
    """RunFailure when a whole batch of samples at temperature > 0 is one text: the server is not sampling."""
    if cfg.temperature > 0 and len(results) >= 4 and len({text for _, text, _ in results}) == 1:
        raise RunFailure(
            f"{', '.join(cfg.base_urls)}: {len(results)} samples at temperature {cfg.temperature} are the same "
            "text: the server decodes greedily (transformers serve --continuous-batching samples only if the model's "
            "generation_config.json sets do_sample; serve without --continuous-batching, or use SGLang)"
        )


def _summary(job: Job) -> dict:
    return {"out": str(job.out), "kept": len(job.kept), "attempts": job.attempts, "refused": dict(job.reasons)}


# -------------------------------------------------------------------------------------- CLI


def add_prompts_parser(subparsers) -> None:
    p = subparsers.add_parser("prompts", help="write broad training prompts with the target itself (Magpie)")
    sub = p.add_subparsers(dest="prompts", required=True)
    g = sub.add_parser("generate", help="sample user turns from the target's chat template on /v1/completions")
    g.add_argument("--base-url", action="append", default=[], help="OpenAI-compatible server (repeatable)")
    g.add_argument(
        "--serve",
        default=None,
        metavar="TARGET",
        help="start a server of this target spec or folder on loopback for the run: `transformers serve` "
        "(sampling, no continuous batching), or --sglang-servers K SGLang servers on this GPU",
    )
    g.add_argument("--sglang-servers", type=number(int, 0), default=0, metavar="K", help="with --serve")
    g.add_argument("--sglang-prefix", default=None, help="offline SGLang install (`draftlab sglang install`)")
    g.add_argument("--device", default="auto", help="auto | cpu | cuda (--serve without SGLang)")
    g.add_argument("--log-dir", default=None, help="where --serve writes its logs (default: beside --out)")
    g.add_argument("--model", default=None, help="the `model` field of requests (default: the served folder)")
    g.add_argument("--tokenizer", help="where the chat template comes from (default: --model)")
    g.add_argument("--n", type=int, required=True, help="prompts to keep")
    g.add_argument("--out", required=True, help="JSONL of canonical conversations (+ .rejects.jsonl, .state.json)")
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--max-tokens", type=int, default=256, help="longest user turn, in tokens")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--system", default=None, help="system prompt (default: the template's own)")
    g.add_argument(
        "--opening",
        dest="openings",
        action="append",
        default=[],
        help="text a user turn starts with, kept in it (repeatable: one per attempt in turn), e.g. "
        "--opening 'Write a Python function that' (no trailing space: the target writes the next word's own)",
    )
    g.add_argument("--follow-ups", default=None, help="answered conversations: write their next user turn")
    g.add_argument("--concurrency", type=int, default=8, help="requests in flight (over all servers)")
    g.add_argument("--max-attempts", type=int, default=20, help="attempts per prompt wanted before giving up")
    g.set_defaults(func=_cmd_generate)


def _cmd_generate(args: argparse.Namespace) -> int:
    fields = {k: getattr(args, k) for k in GenConfig.__dataclass_fields__ if hasattr(args, k)}
    fields["openings"] = tuple(args.openings)
    if not args.serve:
        if not (args.base_url and args.model):
            raise InputError("prompts generate: give --base-url URL and --model NAME, or --serve TARGET")
        summary = generate(GenConfig(base_urls=args.base_url, **fields))
        print(json.dumps(summary))
        return 0
    if args.sglang_servers == 0 and args.sglang_prefix:
        raise InputError("--sglang-prefix: only with --sglang-servers K")
    log_dir = Path(args.log_dir or Path(args.out).parent)
    # transformers serve samples only without continuous batching (the target's generation config)
    servers = serve_target(
        args.serve,
        log_dir,
        sglang_servers=args.sglang_servers,
        prefix=args.sglang_prefix,
        device=args.device,
        continuous_batching=False,
    )
    with servers:
        print(f"servers {servers.urls} ready in {servers.startup_s:.1f} s (logs in {log_dir})", flush=True)
        fields["model"] = args.model or servers.model
        fields["tokenizer"] = args.tokenizer or servers.model
        summary = generate(GenConfig(base_urls=[*servers.urls, *args.base_url], **fields))
    print(json.dumps(summary))
    return 0
