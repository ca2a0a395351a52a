"""Live probe of a running server: its settings, its measured acceptance length, likely causes.

`/server_info` (or the older `/get_server_info`) gives the server's arguments; a few short greedy
requests with meta info give `completion_tokens` and `spec_verify_ct`, from which
acceptance length = sum(completion_tokens) / sum(spec_verify_ct) (contract section 5). A server
that returns no speculative fields gets "absent", never a made-up 1.0.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit

import httpx

from draftlab.core.acceptance import acceptance_length as core_acceptance
from draftlab.flag_diagnosis.checks_server import run_checks
from draftlab.flag_diagnosis.inputs import DoctorInputError, read_draft
from draftlab.sglang.launch import LaunchError, ServerSettings, from_server_info

PROBE_PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number.",
    "List the planets of the solar system in order from the sun.",
    "Explain in two sentences what a hash table is.",
)
# "Near 1.0": below this the draft is contributing almost nothing, which is the collapse signature.
NEAR_ONE = 1.2


@dataclass
class Cause:
    """A likely reason for acceptance near 1.0, with the evidence seen and the fix."""

    score: float  # 0..1, higher = more likely given the evidence
    cause: str
    evidence: str
    fix: str


@dataclass
class ProbeReport:
    url: str
    server_info: dict | None = None
    server_info_endpoint: str | None = None
    settings: ServerSettings | None = None
    endpoint: str | None = None  # where the generation requests went
    requests: list = field(default_factory=list)  # per request: completion_tokens, spec_verify_ct, ...
    acceptance_length: float | None = None
    acceptance_note: str = ""
    lifetime_accept_length: float | None = None
    causes: list = field(default_factory=list)
    errors: list = field(default_factory=list)

    @property
    def collapsed(self) -> bool:
        return self.acceptance_length is not None and self.acceptance_length < NEAR_ONE

    def to_dict(self) -> dict:
        d = asdict(self)
        d["settings"] = asdict(self.settings) if self.settings else None
        d["collapsed"] = self.collapsed
        return d


def acceptance_length(metas: list) -> tuple:
    """(sum(completion_tokens)/sum(spec_verify_ct) or None, note) over per-request meta dicts."""
    if not metas:
        return None, "no request succeeded"
    if any(m.get("spec_verify_ct") is None or m.get("completion_tokens") is None for m in metas):
        return None, "absent: the server returned no spec_verify_ct (it is not speculating, or is not SGLang)"
    verify = sum(int(m["spec_verify_ct"]) for m in metas)
    tokens = sum(int(m["completion_tokens"]) for m in metas)
    if verify == 0:
        return None, f"absent: spec_verify_ct is 0 over {len(metas)} requests ({tokens} tokens): speculation is off"
    return core_acceptance(tokens, verify), f"{tokens} tokens / {verify} verify steps over {len(metas)} greedy requests"


def _meta_from_chat(body: dict) -> dict:
    """completion_tokens / spec_verify_ct from an OpenAI chat response (SGLang puts meta_info in the choice)."""
    choice = (body.get("choices") or [{}])[0]
    meta = dict(choice.get("meta_info") or body.get("meta_info") or body.get("metadata") or {})
    usage = body.get("usage") or {}
    meta.setdefault("completion_tokens", usage.get("completion_tokens"))
    return meta


# Transport errors that mean nothing answers at the address: the probe has nothing to measure.
UNREACHABLE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol, httpx.InvalidURL)


def check_url(url: str) -> str:
    """The base URL without a trailing slash, or DoctorInputError when it cannot name an HTTP server.

    Checked before any request, so a typo is not reported as "not an SGLang server" with exit 0.
    """
    try:
        parts = urlsplit(str(url).strip())
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError as exc:
        raise DoctorInputError(f"--probe {url}", f"not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DoctorInputError(f"--probe {url}", "not an http(s) URL with a host (e.g. http://127.0.0.1:30000)")
    return str(url).strip().rstrip("/")


def _get_json(client: httpx.Client, url: str):
    try:
        r = client.get(url)
    except UNREACHABLE:
        raise  # probe() turns it into one line: the server cannot be reached at all
    except httpx.HTTPError as exc:
        return None, f"GET {url}: {type(exc).__name__}: {exc}"
    if r.status_code != 200:
        return None, f"GET {url}: HTTP {r.status_code}"
    try:
        return r.json(), None
    except ValueError:
        return None, f"GET {url}: answer is not JSON"


def read_server_info(client: httpx.Client, base: str):
    """(info dict, endpoint) from /server_info or /get_server_info, else (None, None)."""
    notes = []
    for path in ("/server_info", "/get_server_info"):
        info, err = _get_json(client, base + path)
        if isinstance(info, dict):
            return info, path, notes
        notes.append(err or f"GET {base + path}: not a JSON object")
    return None, None, notes


def _model_name(client, base, info, model):
    if model:
        return model
    if info:
        for key in ("served_model_name", "model_path"):
            if info.get(key):
                return info[key]
    models, _ = _get_json(client, base + "/v1/models")
    if isinstance(models, dict) and models.get("data"):
        return models["data"][0].get("id", "default")
    return "default"


def _chat(client, base, model, prompt, max_tokens):
    """One greedy chat request with return_meta_info; retried without it if the server rejects the key."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": False,
        "return_meta_info": True,
    }
    r = client.post(base + "/v1/chat/completions", json=body)
    if r.status_code in (400, 422):
        body.pop("return_meta_info")
        r = client.post(base + "/v1/chat/completions", json=body)
    r.raise_for_status()
    return _meta_from_chat(r.json())


def _generate(client, base, prompt, max_tokens):
    """One greedy request to SGLang's native /generate (meta_info is always returned there)."""
    r = client.post(
        base + "/generate", json={"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": max_tokens}}
    )
    r.raise_for_status()
    body = r.json()
    body = body[0] if isinstance(body, list) else body
    return dict(body.get("meta_info") or {})


def probe(
    url: str,
    *,
    draft=None,
    target=None,
    model: str | None = None,
    prompts=PROBE_PROMPTS,
    max_tokens: int = 64,
    timeout: float = 120.0,
) -> ProbeReport:
    """Read the server's settings, measure acceptance length with greedy requests, rank causes if ~1.0.

    Raises DoctorInputError (one line, exit 2 in the CLI) for a malformed URL or a server that
    does not accept the connection: "unreachable" is not a finding about a server.

    draft / target: optional `doctor_checks.DraftFiles` / `TargetInfo` of the draft the server is
    meant to load and its target; their static findings feed the cause ranking.
    """
    base = check_url(url)
    report = ProbeReport(url=base)
    with httpx.Client(timeout=timeout) as client:
        try:
            info, endpoint, notes = read_server_info(client, base)
        except UNREACHABLE as exc:
            reason = str(exc).splitlines()[0] if str(exc) else ""
            raise DoctorInputError(
                f"--probe {base}",
                f"server unreachable ({type(exc).__name__}: {reason}); start it, or check host and port",
            ) from None
        report.server_info, report.server_info_endpoint = info, endpoint
        if info is None:
            report.errors += notes
        else:
            try:
                report.settings = from_server_info(info, source=f"{base}{endpoint}")
            except LaunchError as exc:
                report.errors.append(str(exc))
            states = info.get("internal_states") or []
            if states and isinstance(states[0], dict) and states[0].get("avg_spec_accept_length") is not None:
                report.lifetime_accept_length = float(states[0]["avg_spec_accept_length"])
        name = _model_name(client, base, info, model)
        tried = []  # (endpoint, metas) of each endpoint that answered every prompt
        for ep, send in (
            ("/v1/chat/completions", lambda p: _chat(client, base, name, p, max_tokens)),
            ("/generate", lambda p: _generate(client, base, p, max_tokens)),
        ):
            try:
                tried.append((ep, [send(prompt) for prompt in prompts]))
            except (httpx.HTTPError, ValueError) as exc:
                report.errors.append(f"POST {base}{ep}: {type(exc).__name__}: {exc}".splitlines()[0])
                continue
            if all(m.get("spec_verify_ct") is not None for m in tried[-1][1]):
                break  # spec fields found; no need to try /generate
        with_spec = [t for t in tried if all(m.get("spec_verify_ct") is not None for m in t[1])]
        endpoint_used, metas = (with_spec or tried or [(None, [])])[0]
        report.endpoint = endpoint_used
        report.requests = [
            {
                k: m.get(k)
                for k in ("completion_tokens", "spec_verify_ct", "spec_accept_length", "spec_accept_rate")
                if m.get(k) is not None
            }
            for m in metas
        ]
        report.acceptance_length, report.acceptance_note = acceptance_length(metas)
    if draft is None and report.settings and report.settings.draft_model_path:
        from pathlib import Path

        if (Path(report.settings.draft_model_path) / "config.json").is_file():  # the server's draft is local
            try:
                draft = read_draft(report.settings.draft_model_path)
            except DoctorInputError as exc:
                report.errors.append(str(exc))
    report.causes = rank_causes(report, draft, target)
    return report


def rank_causes(report: ProbeReport, draft=None, target=None) -> list:
    """Likely causes of acceptance near 1.0 (or of an absent measurement), most likely first."""
    s = report.settings
    causes = []
    algo = s.speculative_algorithm if s else None
    if report.acceptance_length is None:
        if s is not None and not s.is_speculative:
            causes.append(
                Cause(
                    0.9,
                    "the server is not speculating",
                    "server_info has no speculative_algorithm",
                    "start it with --speculative-algorithm EAGLE3 --speculative-draft-model-path DRAFT",
                )
            )
        elif s is None:
            causes.append(
                Cause(
                    0.8,
                    "not an SGLang server (or an old one)",
                    "no /server_info and no spec fields in the answers",
                    "probe the SGLang server; other engines do not report spec_verify_ct",
                )
            )
        return causes
    if not report.collapsed:
        if s and s.num_steps and report.acceptance_length > s.num_steps + 1 + 1e-6:
            causes.append(
                Cause(
                    0.9,
                    "impossible acceptance length",
                    f"{report.acceptance_length:.2f} > steps + 1 = {s.num_steps + 1}",
                    "check that completion_tokens and spec_verify_ct come from the same requests",
                )
            )
        return causes
    eagle3_draft = None
    if draft is not None:
        eagle3_draft = bool(draft.uses_aux)
    if algo == "EAGLE" and eagle3_draft:
        causes.append(
            Cause(
                0.95,
                "EAGLE-3 draft served with --speculative-algorithm EAGLE",
                f"server_info speculative_algorithm EAGLE; the draft {draft.folder} is an EAGLE-3 export "
                "(fc over 3 x H)",
                "restart with --speculative-algorithm EAGLE3 (the target then sends the three aux layers and fc runs)",
            )
        )
    elif algo == "EAGLE":
        causes.append(
            Cause(
                0.7,
                "--speculative-algorithm EAGLE with what may be an EAGLE-3 draft",
                f"server_info speculative_algorithm EAGLE, draft {s.draft_model_path}",
                "if the draft's config.json says LlamaForCausalLMEagle3, restart with --speculative-algorithm EAGLE3",
            )
        )
    if s and s.num_draft_tokens is not None and s.num_draft_tokens <= 1:
        causes.append(
            Cause(
                0.8,
                "one draft token per step",
                f"speculative_num_draft_tokens {s.num_draft_tokens}",
                "use --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4",
            )
        )
    if draft is not None:
        for f in run_checks(draft, target, [s] if s else []):
            if f.severity == "error" and f.check != "algorithm":
                causes.append(Cause(0.6, f"draft: {f.what}", f.why, f.fix))
    tokens = sum(r.get("completion_tokens") or 0 for r in report.requests)
    if tokens < 32:
        causes.append(
            Cause(
                0.3,
                "too few tokens to measure",
                f"{tokens} completion tokens in total",
                "probe with longer answers (--max-tokens)",
            )
        )
    causes.append(
        Cause(
            0.2,
            "draft trained for another target, chat template or data",
            "possible whenever acceptance is near 1.0, whatever the flags",
            "run `draftlab doctor --draft DIR --target MODEL` and check the draft on the reference engine",
        )
    )
    return sorted(causes, key=lambda c: -c.score)
