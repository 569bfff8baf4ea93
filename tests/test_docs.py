"""The API page, `docs/api.md`, which mkdocstrings renders from the docstrings (`mkdocs build --strict` in CI): it
lists the public names only, as TRL's API pages do, and the docstrings' cross-references are written in a form that
it renders."""

import ast
import importlib
import inspect
import re
import runpy
from pathlib import Path

import multiagent_trl

ROOT = Path(__file__).resolve().parents[1]
# Hugging Face doc-builder's references, [`Name`] and [`~module.Name`]: mkdocstrings shows them as literal text.
HF_REFERENCE = re.compile(r"\[`[^`\]]+`\](?![(\[])")
# A `::: identifier` entry of the API page and its indented options block.
API_ENTRY = re.compile(r"^::: (\S+)\n((?:[ ]+\S.*\n)*)", re.M)


def docstrings(path: Path):
    """Every docstring of the module at `path`: the module's, its classes' and its functions'."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring:
                yield docstring


def test_docstrings_use_references_the_api_page_renders():
    found = [
        f"{path.name}: {match.group()}"
        for path in sorted((ROOT / "multiagent_trl").glob("*.py"))
        for docstring in docstrings(path)
        for match in HF_REFERENCE.finditer(docstring)
    ]
    assert found == [], "write `Name` (or `trl.Name`) instead of [`Name`] / [`~trl.Name`]"


def test_the_api_page_lists_public_names_only():
    entries = API_ENTRY.findall((ROOT / "docs" / "api.md").read_text())
    documented = set()
    for identifier, options in entries:
        module_name, _, name = identifier.rpartition(".")
        assert not name.startswith("_"), identifier
        target = getattr(importlib.import_module(module_name), name)
        if inspect.ismodule(target):  # a module's own docstring, without its helpers
            assert re.search(r"^\s+members: false$", options, re.M), f"{identifier}: a whole module, helpers included"
        elif module_name == "multiagent_trl":
            assert name in multiagent_trl.__all__, identifier
        else:  # a public name of a user-importable module
            assert target.__module__ == module_name, identifier
        documented.add(getattr(target, "__name__", name))
    assert set(multiagent_trl.__all__) <= documented  # and every name the package exports


def test_the_comlrl_field_tables_are_generated_from_the_layers_table():
    """`docs/comlrl-users.md`'s field blocks are `multiagent_trl.comlrl.fields`' table, with the configs' defaults
    (`python docs/comlrl_fields.py` regenerates them)."""
    from multiagent_trl.comlrl.fields import FAMILIES

    script = runpy.run_path(str(ROOT / "docs" / "comlrl_fields.py"))  # the script's own list and renderer
    assert set(script["CONFIGS"]) == set(FAMILIES)
    text = (ROOT / "docs" / "comlrl-users.md").read_text()
    assert all(f"<!-- fields: {family} -->" in text for family in FAMILIES)
    assert text == script["render"](text)
