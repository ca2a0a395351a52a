"""Figures of the package's shape for issue 16: modules, internal import cycles, imports inside
functions, imports that run up the layers, the longest function.

Run: python scripts/house_figures.py [lib/draftlab]. Reads source only (ast), imports nothing.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def internal_imports(tree: ast.AST, name: str, is_package: bool, modules: set[str]):
    """(target module, inside a function?) for each import of a draftlab module."""
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.split(".")[0] == "draftlab":
                        found.append((alias.name, in_function))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    pkg = name.split(".") if is_package else name.split(".")[:-1]
                    pkg = pkg[: len(pkg) - child.level + 1]
                    base = ".".join(pkg + ([base] if base else []))
                if base.split(".")[0] != "draftlab":
                    continue
                subs = {f"{base}.{a.name}" for a in child.names} & modules
                for target in sorted(subs) or [base]:
                    found.append((target, in_function))
            visit(child, inner)

    visit(tree, False)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            strong(v)
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else "lib/draftlab")
    files = sorted(root.rglob("*.py"))
    names = {module_name(root, f): f for f in files}
    modules = set(names)
    graph, total, inside, longest = {}, 0, 0, (0, "")
    pairs = pairs_inside = 0
    for name, path in names.items():
        tree = ast.parse(path.read_text())
        edges = internal_imports(tree, name, path.name == "__init__.py", modules)
        # importing a package's own __init__ (draftlab itself) is not an edge worth counting
        edges = [(t, f) for t, f in edges if t != "draftlab" and t != name]
        total += len(edges)
        inside += sum(1 for _, f in edges if f)
        pairs += len({t for t, _ in edges})
        pairs_inside += len({t for t, _ in edges} - {t for t, f in edges if not f})
        graph[name] = {t for t, _ in edges if t in modules}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > longest[0]:
                    longest = (length, f"{name}.{node.name}")
    big = sorted(((len(p.read_text().splitlines()), n) for n, p in names.items()), reverse=True)
    print(f"modules: {len([f for f in files if f.name != '__init__.py'])} "
          f"(+{len(files) - len([f for f in files if f.name != '__init__.py'])} __init__)")
    print(f"internal import statements: {total}, inside functions: {inside}")
    print(f"module -> module imports: {pairs}, only inside functions: {pairs_inside}")
    found = cycles(graph)
    print(f"import cycles (strongly connected groups): {len(found)}")
    for comp in found:
        print("  " + " <-> ".join(comp))
    print(f"longest function: {longest[0]} lines ({longest[1]})")
    print("largest modules: " + ", ".join(f"{n} {k}" for k, n in big[:5]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
