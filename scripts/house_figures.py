"""Figures of the package's shape for issue 16: modules, import cycles, imports inside functions,
the longest function, the largest modules.

Run: python3 scripts/house_figures.py [CHECKOUT] (default: this one). Reads the source with ast
through the import rules' own helpers (tests/test_architecture.py), so the figures and the rules
see the same graph; CHECKOUT measures another tree (e.g. an older commit's `git archive`).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import test_architecture  # noqa: E402
from test_architecture import edges, import_graph, modules, strongly_connected  # noqa: E402


def main(argv: list[str]) -> int:
    if argv:
        test_architecture.ROOT = Path(argv[0]).resolve()
        test_architecture.LIB = test_architecture.ROOT / "lib" / "draftlab"
    known = modules()
    plain = [n for n, p in known.items() if p.name != "__init__.py"]
    found = list(edges())
    pairs = {(src, dst) for src, dst, *_ in found if dst not in (src, "draftlab")}
    eager = {(src, dst) for src, dst, _, lazy, _ in found if not lazy}
    longest, where = 0, ""
    for name, path in known.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if node.end_lineno - node.lineno + 1 > longest:
                longest, where = node.end_lineno - node.lineno + 1, f"{name}.{node.name}"
    print(f"modules: {len(plain)} (+{len(known) - len(plain)} __init__)")
    print(f"internal import statements: {len(found)}, inside functions: {sum(1 for e in found if e[3])}")
    print(f"module -> module imports: {len(pairs)}, only inside functions: {len(pairs - eager)}")
    cycles = strongly_connected(import_graph())
    print(f"import cycles (strongly connected groups): {len(cycles)}")
    for group in cycles:
        print("  " + " <-> ".join(group))
    print(f"longest function: {longest} lines ({where})")
    sizes = sorted(((len(p.read_text().splitlines()), n) for n, p in known.items()), reverse=True)
    print("largest modules: " + ", ".join(f"{n} {k}" for k, n in sizes[:5]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
