"""requirements.txt alone runs the package: every third-party module the runtime code imports (at
module level or inside a function) is provided by a requirement there or by what those requirements
declare, and so is what transformers needs for the features the package calls (jinja2 for chat
templates). The fast, local warning; CI's runtime-only stage (.ci/check_runtime) is the proof.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
import textwrap

import pytest

from tests.fakes import REPO, subprocess_env
from tests.runtime_closure import closure, module_distributions, provided

# What a user runs: the package, the configs and examples, and the root scripts (bench/ and tests/ are
# developer tools, run where requirements-test.txt is installed).
RUNTIME_SOURCES = [
    *sorted((REPO / "gd2po_jax").rglob("*.py")),
    *sorted((REPO / "configs").glob("*.py")),
    *sorted((REPO / "examples").rglob("*.py")),
    *sorted(REPO.glob("*.py")),
]
FIRST_PARTY = {"gd2po_jax", "configs", "tests", "bench"}

# Optional extras in pyproject.toml: imported only inside the function that uses them.
OPTIONAL = {"wandb": "wandb"}

# A method the package calls -> the module the library behind it needs at call time (not at import).
FEATURES = {
    "apply_chat_template": "jinja2",  # transformers' chat templates
}


def _type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def third_party_imports(path: pathlib.Path) -> list[tuple[str, int, bool]]:
    """(top-level module, line, inside a function) of each absolute import in ``path`` that is neither
    the standard library, first-party, nor a module beside the file; TYPE_CHECKING blocks skipped."""
    siblings = {p.stem for p in path.parent.glob("*.py")} | {p.name for p in path.parent.iterdir() if p.is_dir()}
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if _type_checking_block(child):
                continue
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                names = [child.module]
            else:
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
                continue
            for name in names:
                top = name.partition(".")[0]
                if top not in sys.stdlib_module_names and top not in FIRST_PARTY and top not in siblings:
                    found.append((top, child.lineno, in_function))

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


def test_the_runtime_closure_holds_the_pins_and_what_they_declare():
    runtime = closure("requirements.txt")
    assert {"jax", "transformers", "jinja2", "markupsafe"} <= runtime  # markupsafe: jinja2's own requirement
    assert not {"torch", "pytest", "peft", "hypothesis"} & runtime
    assert runtime < closure("requirements-test.txt")


def test_the_import_scan_sees_imports_in_functions_and_skips_type_checking(tmp_path):
    source = tmp_path / "module.py"
    source.write_text(textwrap.dedent("""
        import os
        import numpy as np
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            import torch
        from . import sibling
        import helper
        def f():
            from jinja2 import Template
            return Template
    """))
    (tmp_path / "helper.py").write_text("")
    assert third_party_imports(source) == [("numpy", 3, False), ("jinja2", 10, True)]


def test_every_third_party_import_comes_with_requirements_txt():
    missing = []
    for path in RUNTIME_SOURCES:
        for module, line, in_function in third_party_imports(path):
            where = f"{path.relative_to(REPO)}:{line} imports {module}"
            if module in OPTIONAL:
                if not in_function:
                    missing.append(f"{where} at module level (the optional extra [{OPTIONAL[module]}] "
                                   "may only be imported inside the function that uses it)")
            elif module not in module_distributions():
                missing.append(f"{where}, which no installed distribution provides")
            elif not provided(module):
                missing.append(f"{where}, which requirements.txt does not provide "
                               f"(it comes from {sorted(module_distributions()[module])})")
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("method, module", sorted(FEATURES.items()))
def test_every_library_feature_the_package_calls_has_its_module(method, module):
    callers = [str(p.relative_to(REPO)) for p in RUNTIME_SOURCES if f".{method}(" in p.read_text()]
    assert callers, f"no runtime source calls .{method}(: drop it from FEATURES"
    assert provided(module), f"{', '.join(callers)} call .{method}, which needs {module}: add it to requirements.txt"


def test_a_chat_template_really_needs_jinja2():
    """The FEATURES entry is real: with jinja2 hidden (as in a venv without it) transformers' chat
    template fails naming jinja2; with it, the same call renders."""
    script = textwrap.dedent("""
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast
        backend = Tokenizer(models.WordLevel({"[UNK]": 0, "hi": 1}, unk_token="[UNK]"))
        backend.pre_tokenizer = pre_tokenizers.Whitespace()
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
        tokenizer.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        print(tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False))
    """)

    def run(hidden: str):
        return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                              env=subprocess_env(GD2PO_JAX_HIDDEN_MODULES=hidden))

    without = run("jinja2")
    assert without.returncode != 0 and "jinja2" in without.stderr.splitlines()[-1], without.stderr[-2000:]
    with_it = run("torch")
    assert with_it.returncode == 0 and with_it.stdout.strip() == "<user>hi", with_it.stderr[-2000:]
