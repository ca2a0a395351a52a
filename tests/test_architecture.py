"""The import rules of docs/architecture.md, read from the source with ast (nothing is imported).

Layers: core -> model -> engine -> sglang -> run -> the stage packages in notebook order. A
module imports only its own layer or lower ones; a stage imports earlier stages only through
their public names; nothing imports in a cycle; only the command table (cli.py) imports lazily;
a notebook imports run.notebook, the shared layers and its own stage. core has no torch.
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "lib" / "draftlab"
NOTEBOOKS = ROOT / "notebooks"

# shared layers, lowest first; `sglang` is the SGLang bundle/server package (core and model only)
SHARED = ["core", "model", "engine", "sglang", "run"]
# what each shared layer may import besides itself
SHARED_ALLOWED = {
    "core": set(),
    "model": {"core"},
    "engine": {"core", "model"},
    "sglang": {"core", "model"},
    "run": {"core", "model", "sglang"},
}
STAGES = [
    "environment_check",
    "dataset_discovery",
    "blend",
    "regenerate",
    "train_draft",
    "flag_diagnosis",
    "benchmark_acceptance",
    "data_scaling",
]
MAX_LINES = 500


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(LIB.rglob("*.py")):
        parts = list(path.relative_to(LIB.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def draftlab_imports(path: Path):
    """(imported module, imported names, inside a function?, line) for every draftlab import."""
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if isinstance(child, ast.Import):
                    items = [(a.name, []) for a in child.names]
                else:
                    assert not child.level, f"{path}:{child.lineno}: use absolute draftlab imports"
                    items = [(child.module or "", [a.name for a in child.names])]
                for module, names in items:
                    if module == "draftlab" or module.startswith("draftlab."):
                        found.append((module, names, in_function, child.lineno))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text()), False)
    return found


def resolve(module: str, names: list[str], known: dict) -> list[str]:
    """The draftlab modules an import statement reaches (`from draftlab.x import y` may name module x.y)."""
    subs = [f"{module}.{n}" for n in names if f"{module}.{n}" in known]
    return subs or [module]


def top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def edges():
    """(importing module, imported module, names, inside a function?, where) over lib/draftlab."""
    known = modules()
    for name, path in known.items():
        for module, names, lazy, line in draftlab_imports(path):
            for target in resolve(module, names, known):
                yield name, target, names if target == module else [], lazy, f"{path.relative_to(ROOT)}:{line}"


def test_layers_and_stage_order():
    bad = []
    for src, dst, names, _, where in edges():
        a, b = top(src), top(dst)
        if a in ("", "cli") or a == b or dst == "draftlab":
            continue
        if a in SHARED:
            if b not in SHARED_ALLOWED[a]:
                bad.append(f"{where}: {src} (layer {a}) imports {dst}")
        elif a in STAGES:
            if b in STAGES:
                if STAGES.index(b) > STAGES.index(a):
                    bad.append(f"{where}: stage {a} imports the later stage {b} ({dst})")
                private = [n for n in names if n.startswith("_")] or [p for p in dst.split(".") if p.startswith("_")]
                if private:
                    bad.append(f"{where}: stage {a} imports private names {private} of stage {b}")
            elif b not in SHARED:
                bad.append(f"{where}: {src} imports {dst}, which is in no layer")
        else:
            bad.append(f"{where}: {src} is in no layer (add it to a package of docs/architecture.md)")
    assert not bad, "\n".join(bad)


def import_graph() -> dict[str, set]:
    graph: dict[str, set] = {}
    for src, dst, *_ in edges():
        if dst != src and dst != "draftlab":
            graph.setdefault(src, set()).add(dst)
    return graph


def strongly_connected(graph: dict[str, set]) -> list[list[str]]:
    """The groups of more than one module that import each other, directly or not (Tarjan)."""
    index, low, stack, on, groups = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in list(graph):
        if v not in index:
            strong(v)
    return groups


def test_no_import_cycles():
    cycles = strongly_connected(import_graph())
    assert not cycles, cycles


def test_lazy_imports_only_in_the_command_table():
    lazy = [where for src, _, _, is_lazy, where in edges() if is_lazy and src != "draftlab.cli"]
    assert not lazy, "import at the top of the module instead:\n" + "\n".join(lazy)


def test_core_has_no_torch():
    for name, path in modules().items():
        if top(name) != "core":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not any(m.split(".")[0] in ("torch", "transformers") for m in mods), f"{path}:{node.lineno}"


def test_modules_stay_small():
    big = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not big, f"split these along their banner comments: {big}"


def test_every_stage_has_a_package_with_a_cli():
    for stage in STAGES:
        assert (LIB / stage / "__init__.py").is_file(), stage
        assert (LIB / stage / "cli.py").is_file() or stage == "data_scaling", f"{stage}/cli.py missing"


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py")), ids=lambda p: p.stem)
def test_notebook_imports(path):
    """A notebook is parameters, calls, plots and findings: it imports its own stage and the shared layers."""
    stem = path.stem.split("_", 1)[1]
    assert stem in STAGES, f"{path.name}: no package draftlab.{stem}"
    bad = []
    for module, names, _, line in draftlab_imports(path):
        targets = resolve(module, names, modules())
        for target in targets:
            layer = top(target)
            if target == "draftlab.run.notebook" or layer in ("core", "model", "engine", "sglang", stem):
                continue
            bad.append(f"{path.name}:{line}: {target}")
    assert not bad, "\n".join(bad)


# ---- three houses: the product (lib/draftlab), its studies (studies/), the GPU harness (ops/) -------------
HOUSES = {"studies": ROOT / "studies", "ops": ROOT / "ops"}
# a string that runs a house: `-m studies.x` / `-m ops.x` as one argv element or in a shell line, or a
# path into a house as an argv element; prose naming a house (a docstring, a sentence) is not a spawn
SPAWN = re.compile(r"^(ops|studies)[./]\w|-m\s+(ops|studies)\b|(bash|sh|python3?)\s+(ops|studies)/")


def docstrings(tree) -> set[int]:
    """ids of the docstring constants of a module and of its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def strings(path: Path):
    """(text, line) of every string constant of a module but its docstrings."""
    tree = ast.parse(path.read_text())
    skip = docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node.value, node.lineno


def imports_of(path: Path):
    """(module, names, line) of every import of a file."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((a.name, [], node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            yield node.module or "", [a.name for a in node.names], node.lineno


def test_the_product_never_imports_or_spawns_studies_or_ops():
    bad = []
    for path in modules().values():
        where = path.relative_to(ROOT)
        for module, _, line in imports_of(path):
            if module.split(".")[0] in HOUSES:
                bad.append(f"{where}:{line}: imports {module}")
        for text, line in strings(path):
            if SPAWN.search(text):
                bad.append(f"{where}:{line}: runs a house: {text[:80]!r}")
    assert not bad, "\n".join(bad)


def test_the_spawn_rule_sees_a_spawn_and_not_prose():
    assert SPAWN.search("ops/gpu/step.sh") and SPAWN.search("studies.recipes")
    assert SPAWN.search("python -m studies.recipes train") and SPAWN.search("bash ops/gpu/sglang.sh")
    assert not SPAWN.search("Full profile, run with `ops/gpu/step.sh` on one H200")
    assert not SPAWN.search("the recipe study's records (results/recipes/)")


@pytest.mark.parametrize("house", sorted(HOUSES))
def test_studies_and_ops_use_only_the_products_public_names(house):
    """As a user's own scripts would: no private module or name, and none of the harness's old homes."""
    files = sorted(p for p in HOUSES[house].rglob("*.py") if "tests" not in p.relative_to(HOUSES[house]).parts)
    assert files, house
    bad = []
    for path in files:
        for module, names, line in imports_of(path):
            if module != "draftlab" and not module.startswith("draftlab."):
                continue
            private = [p for p in module.split(".") if p.startswith("_")] + [n for n in names if n.startswith("_")]
            if private:
                bad.append(f"{path.relative_to(ROOT)}:{line}: private {private} of {module}")
            if module.startswith("draftlab.run.gpu_") or any(n.startswith("gpu_") for n in names):
                bad.append(f"{path.relative_to(ROOT)}:{line}: {module} (the GPU harness lives in ops/)")
    assert not bad, "\n".join(bad)
    big = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not big, f"split these by purpose: {big}"


# the product's SGLang launch lines are built in one module; the parser and the server's argv check
# recognise the launcher (its name, its tokens, their one-line errors), which builds nothing
LAUNCHER = "sglang.launch_server"
LAUNCH_BUILDER = "draftlab.sglang.commands"
LAUNCH_READERS = {"draftlab.sglang.launch", "draftlab.sglang.server"}


def test_sglang_launch_lines_are_built_in_one_module():
    bad = []
    for name, path in modules().items():
        if name == LAUNCH_BUILDER or name in LAUNCH_READERS:
            continue
        bad += [f"{path.relative_to(ROOT)}:{line}: {text[:80]!r}" for text, line in strings(path) if LAUNCHER in text]
    assert not bad, f"build SGLang launch lines with {LAUNCH_BUILDER}:\n" + "\n".join(bad)
    for name in LAUNCH_READERS:  # the readers never build a launch argv: the name is never a list's element
        tree = ast.parse(modules()[name].read_text())
        built = [
            n.lineno
            for n in ast.walk(tree)
            if isinstance(n, (ast.List, ast.Tuple))
            and any(isinstance(e, ast.Constant) and e.value == LAUNCHER for e in n.elts)
        ]
        assert not built, f"{name}: a launch argv built at lines {built}; build it in {LAUNCH_BUILDER}"
    assert LAUNCHER in modules()[LAUNCH_BUILDER].read_text()


def test_the_run_folder_layout_has_one_owner():
    """The run folder is the interface between stages: its places are named in core/run_folder.py alone
    (RunFolder), so no module or notebook spells another stage's folder."""
    import re

    # a run folder (run, run_dir, run.dir, self.dir, Path(run_dir)) joined with one of its places' names
    spelled = re.compile(
        r'\b(run|run_dir|dir)\)? / "(drafts|data|figures|executed|sglang|metrics\.json|run\.json|params\.yaml)"'
    )
    owner = LIB / "core" / "run_folder.py"
    bad = []
    for path in [*sorted(LIB.rglob("*.py")), *sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))]:
        if path == owner:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if spelled.search(line):
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not bad, "use draftlab.core.run_folder.RunFolder:\n" + "\n".join(bad)
