"""The package's shape: its import graph has no cycle (imports inside functions included), the
config package is a leaf, and only gd2po_jax/tasks/ knows task names."""

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


def test_the_config_package_is_a_leaf():
    """gd2po_jax.config imports nothing of the package but gd2po_jax.errors (the lowest layer): each of
    its modules imports only its own modules (absolutely, so that the import graph sees them)."""
    modules = package_modules()
    config = {name: tree for name, tree in modules.items()
              if name == "gd2po_jax.config" or name.startswith("gd2po_jax.config.")}
    assert {"gd2po_jax.config", "gd2po_jax.config.base", "gd2po_jax.config.run"} <= set(config)
    for name, tree in config.items():
        outside = {m for m in imported_modules(tree, modules)
                   if m not in ("gd2po_jax.config", "gd2po_jax.errors") and not m.startswith("gd2po_jax.config.")}
        assert not outside, f"{name} imports {sorted(outside)}"
        relative = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level]
        assert not relative, f"{name}: relative imports at lines {relative}"


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


# The layer contract (docs/architecture.md): a package may import only packages on its own layer's left,
# or on the same layer when listed as such below. `gd2po_jax/__init__.py` imports nothing.
LAYERS = [
    ["errors"],
    ["config"],
    ["runtime"],
    ["models", "data"],
    ["rewards"],
    ["training"],
    ["tasks"],
    ["rl"],
    ["sft", "evaluation"],
    ["jobs", "experiments"],
    ["cli"],
]
"""Bottom to top. Packages on one layer do not import each other."""


def layer_of(module: str) -> int:
    top = module.split(".")[1] if module.count(".") else ""
    for index, layer in enumerate(LAYERS):
        if top in layer:
            return index
    raise AssertionError(f"{module}: its package {top!r} has no layer in tests/test_package.py LAYERS")


def upward_imports(modules: dict[str, ast.Module]) -> list[str]:
    """'a -> b' for each import of a module on a higher layer, or of another package on the same layer."""
    found = []
    for name, tree in modules.items():
        if name == "gd2po_jax":
            continue
        for target in sorted(imported_modules(tree, modules)):
            if target == "gd2po_jax" or target.split(".")[:2] == name.split(".")[:2]:
                continue
            if layer_of(target) >= layer_of(name):
                found.append(f"{name} -> {target}")
    return found


def test_every_package_has_a_layer():
    for name in package_modules():
        if name != "gd2po_jax":
            layer_of(name)


def test_no_import_runs_up_the_layers():
    assert upward_imports(package_modules()) == []


def test_the_layer_rule_finds_an_upward_import():
    modules = {"gd2po_jax.rl.step": ast.parse("from gd2po_jax.jobs.train import run"),
               "gd2po_jax.jobs.train": ast.parse("from gd2po_jax.rl.step import x"),
               "gd2po_jax.sft.a": ast.parse("from gd2po_jax.evaluation import b"),
               "gd2po_jax.evaluation": ast.parse("")}
    assert upward_imports(modules) == ["gd2po_jax.rl.step -> gd2po_jax.jobs.train",
                                       "gd2po_jax.sft.a -> gd2po_jax.evaluation"]


def test_each_package_docstring_names_what_it_may_import():
    """Each package's docstring has a line 'May import: ...' naming exactly the packages below its layer."""
    for name, tree in package_modules().items():
        if name.count(".") != 1 or not (PACKAGE / name.split(".")[1]).is_dir():
            continue
        doc = ast.get_docstring(tree) or ""
        lines = [line for line in doc.splitlines() if line.startswith("May import:")]
        assert lines, f"{name}/__init__.py: its docstring has no 'May import:' line"
        named = {word.strip(" .,") for word in lines[0].removeprefix("May import:").split()}
        below = {package for layer in LAYERS[:layer_of(name)] for package in layer}
        assert named - {"nothing", "and"} == below, f"{name}: 'May import:' names {sorted(named)}, the layers below are {sorted(below)}"
