"""Read SGLang launch commands back into flags, and write corrected ones.

`draftlab.core.serve` builds launch strings; doctor has to read the ones people actually typed
(`python -m sglang.launch_server ...`, `sglang serve ...`, with `VAR=1` prefixes, `--flag=value`
or `--flag value`, and argparse prefixes like `--speculative-algo`, which SGLang also accepts).
`ServerSettings` is the part of a server's configuration doctor checks; it comes either from a
launch command or from a saved `/server_info` answer.
"""

from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import dataclass, field

# SGLang's default cap on running requests for EAGLE-family algorithms when none is given.
EAGLE_DEFAULT_MAX_RUNNING_REQUESTS = 48
SPEC_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "LOOKAHEAD")
_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


class LaunchError(ValueError):
    """A launch command or server_info file that cannot be read; the message names it."""


@dataclass
class ServerSettings:
    """What doctor needs to know about one server, from a command line or /server_info."""

    source: str  # the command string, or "server_info FILE"
    command: str | None = None  # the launch command when the settings came from one
    env: dict = field(default_factory=dict)
    model_path: str | None = None
    speculative_algorithm: str | None = None
    draft_model_path: str | None = None
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None
    max_running_requests: int | None = None
    context_length: int | None = None
    unknown: list = field(default_factory=list)  # tokens the parser did not recognise

    @property
    def is_speculative(self) -> bool:
        return bool(self.speculative_algorithm)

    @property
    def effective_max_running_requests(self) -> int | None:
        """The cap the server really uses: EAGLE-family servers default to 48, others size it from memory."""
        if self.max_running_requests is not None:
            return self.max_running_requests
        if self.speculative_algorithm and self.speculative_algorithm.upper() in ("EAGLE", "EAGLE3", "NEXTN"):
            return EAGLE_DEFAULT_MAX_RUNNING_REQUESTS
        return None  # sized from memory at start-up


def positive_count(value) -> int:
    """A step, top-k or draft-token count as SGLang needs it: an integer of at least 1.

    SGLang does not refuse 0 or a negative count at parse time; it fails later (or drafts nothing),
    so the doctor refuses them here, for launch commands and server_info alike.
    """
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"{value!r} is not a positive integer")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{value!r} is not a positive integer") from None
    if number < 1:
        raise ValueError(f"{value!r} is not a positive integer")
    return number


def _count(text: str) -> int:
    try:
        int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    try:
        return positive_count(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def algorithm(value, source: str) -> str | None:
    """--speculative-algorithm upper-cased as SGLang does, or LaunchError for a name SGLang does not know.

    A near miss such as EAGLE9 must not be read as EAGLE: the explanation of the EAGLE flag bug
    would then be about a flag the server never got (SGLang refuses the unknown name at start-up).
    """
    if value is None or value == "":
        return None
    name = str(value).upper()
    if name not in SPEC_ALGORITHMS:
        raise LaunchError(
            f"{source}: --speculative-algorithm {value} is not one SGLang knows ({', '.join(SPEC_ALGORITHMS)})"
        )
    return name


def _parser() -> argparse.ArgumentParser:
    """The SGLang server flags doctor reads; everything else is kept as unknown."""
    p = argparse.ArgumentParser(prog="sglang.launch_server", add_help=False, allow_abbrev=True, exit_on_error=False)
    p.add_argument("--model-path", "--model")
    p.add_argument("--served-model-name")
    p.add_argument("--speculative-algorithm")
    p.add_argument("--speculative-draft-model-path", "--speculative-draft-model")
    p.add_argument("--speculative-draft-model-revision")  # listed so that prefixes stay unambiguous
    p.add_argument("--speculative-draft-load-format")
    p.add_argument("--speculative-num-steps", type=_count)
    p.add_argument("--speculative-eagle-topk", type=_count)
    p.add_argument("--speculative-num-draft-tokens", type=_count)
    p.add_argument("--speculative-token-map")
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--max-total-tokens", type=int)
    p.add_argument("--context-length", type=int)
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    return p


def _short(command: str, n: int = 80) -> str:
    return repr(command if len(command) <= n else command[:n] + "...")


def split_command(command: str) -> tuple[dict, list[str]]:
    """shlex-split a command; return leading VAR=value assignments and the server's own arguments."""
    env, args, _ = _split(command)
    return env, args


def _split(command: str) -> tuple[dict, list[str], bool]:
    """split_command, plus whether an SGLang launcher (launch_server, sglang serve) was found."""
    if not command or not command.strip():
        raise LaunchError(
            "launch command is empty: give the SGLang command line (python -m sglang.launch_server --model-path M ...)"
        )
    try:
        tokens = shlex.split(command.replace("\\\n", " "))
    except ValueError as exc:  # unbalanced quotes
        raise LaunchError(f"launch command {_short(command)}: cannot split it ({exc})") from exc
    env = {}
    while tokens and _ENV_ASSIGNMENT.match(tokens[0]):
        key, _, value = tokens.pop(0).partition("=")
        env[key] = value
    if tokens and tokens[0] == "env":
        tokens.pop(0)
        while tokens and _ENV_ASSIGNMENT.match(tokens[0]):
            key, _, value = tokens.pop(0).partition("=")
            env[key] = value
    # Skip the launcher (python -m sglang.launch_server, sglang serve, docker ... launch_server).
    for i, tok in enumerate(tokens):
        if tok.endswith("launch_server") or tok.endswith("launch_server.py"):
            return env, tokens[i + 1 :], True
        if tok == "serve" and i > 0 and tokens[i - 1].endswith("sglang"):
            return env, tokens[i + 1 :], True
    # Only flags were given (or an unknown launcher): read from the first flag on.
    first_flag = next((i for i, t in enumerate(tokens) if t.startswith("-")), len(tokens))
    return env, tokens[first_flag:], False


def parse_launch(command: str) -> ServerSettings:
    """Parse one SGLang launch command string into `ServerSettings`.

    Raises LaunchError (one line) for what cannot be a server command: an empty string, text with
    neither an SGLang launcher nor one flag SGLang knows, an unknown algorithm, a count below 1.
    """
    env, args, launcher = _split(command)
    try:
        ns, unknown = _parser().parse_known_args(args)
    except (argparse.ArgumentError, SystemExit) as exc:
        raise LaunchError(f"launch command {_short(command)}: {exc}") from exc
    if not launcher and all(v is None for v in vars(ns).values()):
        raise LaunchError(
            f"launch command {_short(command)}: not an SGLang launch command (no launch_server or "
            "`sglang serve`, and no SGLang server flag)"
        )
    algo = algorithm(ns.speculative_algorithm, f"launch command {_short(command)}")
    return ServerSettings(
        source=command,
        command=command,
        env=env,
        model_path=ns.model_path,
        speculative_algorithm=algo,
        draft_model_path=ns.speculative_draft_model_path,
        num_steps=ns.speculative_num_steps,
        eagle_topk=ns.speculative_eagle_topk,
        num_draft_tokens=ns.speculative_num_draft_tokens,
        max_running_requests=ns.max_running_requests,
        context_length=ns.context_length,
        unknown=unknown,
    )


def from_server_info(info: dict, source: str = "server_info") -> ServerSettings:
    """ServerSettings from SGLang's /server_info JSON (server args are top-level keys there)."""
    if not isinstance(info, dict):
        raise LaunchError(f"{source}: expected a JSON object, got {type(info).__name__}")

    def as_int(key):
        value = info.get(key)
        if value is None:
            return None
        try:
            return int(value)
        except (TypeError, ValueError) as exc:
            raise LaunchError(f"{source}: field {key!r} is not an integer ({value!r})") from exc

    def as_count(key):
        value = as_int(key)
        try:
            return None if value is None else positive_count(value)
        except ValueError as exc:
            raise LaunchError(f"{source}: field {key!r}: {exc}") from exc

    return ServerSettings(
        source=source,
        model_path=info.get("model_path"),
        speculative_algorithm=algorithm(info.get("speculative_algorithm"), source),
        draft_model_path=info.get("speculative_draft_model_path"),
        num_steps=as_count("speculative_num_steps"),
        eagle_topk=as_count("speculative_eagle_topk"),
        num_draft_tokens=as_count("speculative_num_draft_tokens"),
        max_running_requests=as_int("max_running_requests"),
        context_length=as_int("context_length") or as_int("context_len"),
    )


def _matches(token: str, flag: str) -> bool:
    """Whether a command token sets `flag` (exactly, as --flag=value, or as an unambiguous prefix)."""
    name = token.split("=", 1)[0]
    if not name.startswith("--") or len(name) < 4:
        return False
    return name == flag or (flag.startswith(name) and name.count("-") >= 3)


def set_flag(command: str, flag: str, value) -> str:
    """The same command with `flag` set to `value` (replaced where present, appended otherwise)."""
    tokens = shlex.split(command.replace("\\\n", " "))
    out, i, done = [], 0, False
    while i < len(tokens):
        tok = tokens[i]
        if _matches(tok, flag):
            out += [flag, str(value)] if not done else []
            done = True
            i += 1 if "=" in tok else 2
            continue
        out.append(tok)
        i += 1
    if not done:
        out += [flag, str(value)]
    return shlex.join(out)


def remove_flag(command: str, flag: str) -> str:
    """The same command without `flag` (and its value)."""
    tokens = shlex.split(command.replace("\\\n", " "))
    out, i = [], 0
    while i < len(tokens):
        if _matches(tokens[i], flag):
            i += 1 if "=" in tokens[i] else 2
            continue
        out.append(tokens[i])
        i += 1
    return shlex.join(out)
