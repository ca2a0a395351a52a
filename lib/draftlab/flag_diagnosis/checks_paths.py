"""Do the launch line's paths name what doctor checked? `--model-path` against `--target`,
`--speculative-draft-model-path` against `--draft`, and whether that draft path exists here.

A doctor that checks one folder while the server loads another says "all ok" about the wrong files.
"""

from __future__ import annotations

from pathlib import Path

from draftlab.flag_diagnosis.inputs import DraftFiles, Finding, TargetInfo, load_target_info


def looks_local(path: str) -> bool:
    """A filesystem path rather than a Hub id (`owner/name`)."""
    return path.startswith(("/", ".", "~")) or str(path).count("/") != 1 or Path(path).expanduser().exists()


def _folder(path: str) -> Path | None:
    """The model folder a local path names (a config.json names its folder), resolved; None if absent."""
    p = Path(path).expanduser()
    if p.is_file() and p.name == "config.json":
        p = p.parent
    return p.resolve() if p.is_dir() else None


def target_folder(t: TargetInfo) -> Path:
    return t.config_path.parent.resolve()


def check_model_path(t: TargetInfo, s) -> list:
    """The server's --model-path against the --target doctor read."""
    served = s.model_path
    if not served or served == t.spec:
        return []
    here = _folder(served)
    if here is not None and here == target_folder(t):
        return [Finding("paths", "ok", f"--model-path {served} is the --target {t.spec}", where=s.source)]
    width = ""
    if here is not None and (here / "config.json").is_file():
        other = load_target_info(str(here))
        if other.hidden_size != t.hidden_size:
            width = f" (hidden {other.hidden_size} there, {t.hidden_size} in --target)"
    return [
        Finding(
            "paths",
            "error" if width else "warning",
            f"the server serves --model-path {served}, doctor checked --target {t.spec}{width}",
            "every width and vocabulary check above is about --target, not about the model this server loads",
            f"run doctor with --target {served}, or serve --model-path {t.spec}",
            s.source,
        )
    ]


def check_draft_path(d: DraftFiles | None, s) -> list:
    """The server's --speculative-draft-model-path: present here, and the --draft doctor read."""
    path = s.draft_model_path
    if not path:
        return []
    folder = _folder(path)
    if folder is None and looks_local(path):
        return [
            Finding(
                "paths",
                "warning",
                f"--speculative-draft-model-path {path} does not exist on this machine",
                "an SGLang server started here stops at start-up; on another machine, check that path there",
                f"set --speculative-draft-model-path {d.folder}" if d is not None else "point it at the exported draft",
                s.source,
            )
        ]
    if folder is None:  # a Hub id: SGLang downloads it
        return [
            Finding(
                "paths",
                "info",
                f"--speculative-draft-model-path {path} is not a local folder: SGLang fetches it from the Hub",
                "doctor checked " + (str(d.folder) if d is not None else "no draft files"),
                where=s.source,
            )
        ]
    if d is not None and folder != d.folder.resolve():
        return [
            Finding(
                "paths",
                "warning",
                f"the server loads the draft from {path}, doctor checked --draft {d.folder}",
                "every check of the draft above is about another folder than the one the server loads",
                f"run doctor with --draft {path}, or set --speculative-draft-model-path {d.folder}",
                s.source,
            )
        ]
    return [Finding("paths", "ok", f"--speculative-draft-model-path {path} exists", where=s.source)]


def check_paths(d: DraftFiles | None, t: TargetInfo | None, servers: list) -> list:
    out = []
    for s in servers:
        if not s.command:  # a server_info's paths are the server machine's
            continue
        if t is not None:
            out += check_model_path(t, s)
        out += check_draft_path(d, s)
    return out
