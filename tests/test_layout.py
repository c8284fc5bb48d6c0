"""The tree's shape: every module imports, nothing imports its way back to itself.

The import graph is read from the source (every ``import``, also inside functions and
``TYPE_CHECKING`` blocks, since a lazy import is still a dependency), so a circle fails
here even when import order happens to hide it at run time. Two graphs are checked: the
modules', and the packages' (each module counted as the package under ``harness/`` it
sits in, or ``checks`` / ``faults``): a package whose module reaches into a second package
that reaches back is a circle in the design even when no single module is in one.
"""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# folder -> the import name it is installed under (pyproject.toml's package-dir)
TOP_LEVEL = {"harness": "distdoctor", "checks": "distdoctor.checks",
             "faults": "distdoctor.faults"}


def module_files() -> dict[str, Path]:
    """Dotted name -> file, for every module of the project's own packages."""
    found = {}
    for folder, name in TOP_LEVEL.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts and parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((name, *parts))] = path
    return found


def imports_of(path: Path, name: str, modules: set[str]) -> set[str]:
    """The project modules ``name`` imports: ``from a.b import c`` counts as a.b.c when
    that is a module, else as a.b."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # import a.b.c of a package a.b
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def unit_of(module: str) -> str:
    """The package a module belongs to for the package graph: ``distdoctor.X`` (``checks``
    and ``faults`` among them), or ``distdoctor`` for the modules directly under it."""
    return ".".join(module.split(".")[:2])


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def module_graph() -> dict[str, set[str]]:
    files = module_files()
    return {name: imports_of(path, name, set(files)) for name, path in files.items()}


def package_graph(modules: dict[str, set[str]]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, targets in modules.items():
        edges = graph.setdefault(unit_of(module), set())
        edges.update(unit_of(t) for t in targets if unit_of(t) != unit_of(module))
    return graph


def explain(component: list[str], graph: dict[str, set[str]]) -> str:
    inside = set(component)
    return "; ".join(f"{a} -> {', '.join(sorted(graph[a] & inside))}" for a in component)


def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle():
    """The check below can fail: a planted circle is found, a chain is not."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_graph_reader_sees_lazy_relative_and_submodule_imports(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import os\nfrom . import sibling\n"
                      "def f():\n    from pkg.sub import thing, mod\n")
    modules = {"pkg", "pkg.m", "pkg.sibling", "pkg.sub", "pkg.sub.mod"}
    assert imports_of(source, "pkg.m", modules) == {"pkg.sibling", "pkg.sub", "pkg.sub.mod"}


def test_no_module_imports_its_way_back_to_itself():
    graph = module_graph()
    assert len(graph) > 60  # the walk found the tree, not an empty folder
    found = cycles(graph)
    assert not found, "\n".join(explain(c, graph) for c in found)


def test_no_package_imports_a_package_that_imports_it_back():
    graph = package_graph(module_graph())
    assert {"distdoctor.models", "distdoctor.launch", "distdoctor.checks",
            "distdoctor.faults"} <= set(graph)
    found = cycles(graph)
    assert not found, "\n".join(explain(c, graph) for c in found)


def test_the_data_model_imports_nothing_of_the_project_but_itself():
    graph = package_graph(module_graph())
    assert graph["distdoctor.models"] == set()


def test_at_most_eight_modules_sit_directly_under_harness():
    direct = sorted(p.name for p in (ROOT / "harness").glob("*.py"))
    assert len(direct) <= 8, direct


def test_every_package_opens_with_a_paragraph_on_its_place():
    """Each package says what it does, what it may import and what imports it."""
    for init in sorted((ROOT / "harness").rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc.split()) >= 25, f"{init.relative_to(ROOT)} has no opening paragraph"


def test_every_module_imports_in_a_fresh_interpreter():
    """As ``python -c 'import ...'`` would, one interpreter for the lot: a module that only
    imports after another has run first fails here. The ``__main__`` modules are imported
    too: they run nothing unless started as a program."""
    names = sorted(module_files())
    code = ("import importlib, sys\n"
            f"for name in {names!r}:\n"
            "    importlib.import_module(name)\n"
            "print(len(sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("name", ["CARRIERS", "TRACER_FILE"])
def test_the_files_a_stack_is_trimmed_at_exist(name):
    """Stacks are cut at the frames that only carry a job to the user's code; those are
    named by path, so a moved module must be renamed there too."""
    stacks = importlib.import_module("distdoctor.launch.stacks")
    paths = getattr(stacks, name)
    for path in [paths] if isinstance(paths, str) else paths:
        assert path.startswith("<") or os.path.isfile(path), path
