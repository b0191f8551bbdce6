"""The package's shape: its import graph has no cycle (imports inside functions included), the
config module is a leaf, and only gd2po_jax/tasks/ knows task names."""

from __future__ import annotations

import ast
import pathlib

import gd2po_jax

PACKAGE = pathlib.Path(gd2po_jax.__file__).parent


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, ast.Module]:
    return {module_name(path): ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(tree: ast.Module, modules) -> set[str]:
    """The package modules ``tree`` imports anywhere (``from a import b`` counts a.b when b is a module)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gd2po_jax"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.add(full if full in modules else node.module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name in modules)
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that returns to its start, or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_import_graph_has_no_cycle():
    modules = package_modules()
    graph = {name: imported_modules(tree, modules) - {name} for name, tree in modules.items()}
    # A module's own parent packages are imported with it: not an edge of the graph.
    graph = {name: {target for target in targets if not name.startswith(target + ".")}
             for name, targets in graph.items()}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_config_module_is_a_leaf():
    modules = package_modules()
    assert imported_modules(modules["gd2po_jax.config"], modules) == set()


def test_only_the_tasks_know_task_names():
    """No module outside gd2po_jax/tasks/ compares ``<x>.task`` with a string: they ask the task."""
    offenders = []
    for name, tree in package_modules().items():
        if name.startswith("gd2po_jax.tasks"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                names_task = any(isinstance(side, ast.Attribute) and side.attr == "task" for side in sides)
                has_text = any(isinstance(side, ast.Constant) and isinstance(side.value, str) for side in sides)
                if names_task and has_text:
                    offenders.append(f"{name}:{node.lineno}")
    assert not offenders
