"""The package graph of rank4jax, read from the sources: it has no cycle, and every import points
down the order docs/development.md's layout section states."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "rank4jax"
# top to bottom; a package may import only those below it (the leaves: importable from anywhere)
ORDER = ["experiments", "training", "evaluation", "runs", "prediction", "engine", "checkpoint", "nn", "models", "data"]
LEAVES = {"cli", "signals", "errors", "tokens", "records", "files"}


def package_graph() -> dict[str, set[str]]:
    """package → the rank4jax packages its modules import (the top-level modules count as packages)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts == ("__init__",):
            continue
        here = parts[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" for a in node.names] if node.module == "rank4jax" else [node.module]
            for name in names:
                target = name.split(".")
                if target[0] == "rank4jax" and len(target) > 1 and target[1] != here:
                    graph.setdefault(here, set()).add(target[1])
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path (first node repeated at the end), or None."""
    state: dict[str, str] = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt, [*path, nxt])):
                return found
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node, [node])):
            return found
    return None


def test_cycle_finds_one_and_only_one():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b", "c"}, "b": {"c"}}) is None


def test_packages_import_downwards_only_and_without_cycles():
    graph = package_graph()
    assert cycle(graph) is None, f"import cycle: {' → '.join(cycle(graph))}"
    rank = {name: i for i, name in enumerate(ORDER)}
    assert set(graph) <= set(ORDER) | LEAVES, set(graph) - set(ORDER) - LEAVES
    upward = sorted(
        (a, b)
        for a, targets in graph.items()
        for b in targets
        if b not in LEAVES and rank.get(b, -1) <= rank.get(a, -1)
    )
    assert upward == [], f"imports that point up the order {ORDER}: {upward}"
    assert all(graph.get(leaf, set()) <= LEAVES for leaf in LEAVES), {leaf: graph.get(leaf) for leaf in LEAVES}


def test_every_public_name_imports():
    """``from rank4jax import X`` (and ``rank4jax.nn``'s) for every name the packages list as public."""
    import importlib

    for package in ("rank4jax", "rank4jax.nn"):
        module = importlib.import_module(package)
        for name in module.__all__:
            namespace = {}
            exec(f"from {package} import {name}", namespace)  # noqa: S102 -- the statement a user writes
            assert namespace[name] is getattr(module, name), (package, name)
