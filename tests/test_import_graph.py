"""The import graph of aligner/, webapp/ and worker/: no cycles, and dependencies that point one way.

Every import counts, at module level or inside a function, `import a.b` and `from a import b` alike; importing
`a.b.c` also imports the packages `a` and `a.b` (their __init__ runs first), so those are edges too.
Allowed directions: webapp -> aligner, worker -> aligner and webapp; aligner imports neither service package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("aligner", "webapp", "worker")
# package -> the top-level packages it may import
ALLOWED = {"aligner": {"aligner"}, "webapp": {"aligner", "webapp"}, "worker": {"aligner", "webapp", "worker"}}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            names.add(target)
            names.update(f"{target}.{alias.name}" for alias in node.names)  # `from pkg import submodule`
    return names


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the project modules it imports, with the packages each import runs."""
    graph = {}
    for module, path in modules.items():
        edges = set()
        for name in _imported_names(ast.parse(path.read_text()), module, path.name == "__init__.py"):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                candidate = ".".join(parts[:i])
                if candidate in modules and candidate != module and not module.startswith(candidate + "."):
                    edges.add(candidate)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(project_modules())


def test_the_graph_sees_function_level_imports(graph):
    # aligner.cli imports the trainers inside its command functions only.
    assert "aligner.trainers.reinforce" in graph["aligner.cli"]
    assert "aligner.trainers" in graph["aligner.cli"]  # the package whose __init__ runs first


def test_no_import_cycles(graph):
    assert cycles(graph) == []


def test_dependencies_point_one_way(graph):
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if target.split(".")[0] not in ALLOWED[module.split(".")[0]]
    )
    assert wrong == []


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e2"}, "e2": set()}
    assert cycles(graph) == [["a", "b", "c"]]
