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
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.tier("unit")

ROOT = Path(__file__).resolve().parent.parent
# folder -> the import name it is installed under (pyproject.toml's package-dir)
TOP_LEVEL = {"harness": "distdoctor", "checks": "distdoctor.checks",
             "faults": "distdoctor.faults"}


SCRIPTS = ROOT / "harness" / "teaching" / "exercises"  # students' scripts: run, not imported


def module_files() -> dict[str, Path]:
    """Dotted name -> file, for every module of the project's own packages."""
    found = {}
    for folder, name in TOP_LEVEL.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.is_relative_to(SCRIPTS):
                continue
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


# package -> the packages it may import (short names: ``models`` is distdoctor.models).
# The same table stands in harness/__init__.py's docstring, one ``imports:`` line each.
LAYERS = {
    "models": set(),
    "analysis": {"models"},
    "text": {"models"},
    "faults": {"models"},
    "memory": {"models", "text"},
    "checks": {"models", "analysis", "memory", "faults"},
    "dumps": {"models", "analysis"},
    "trace": {"models", "analysis", "dumps"},
    "launch": {"models", "analysis", "dumps", "trace"},
    "training": {"models", "analysis", "trace", "launch"},  # its steps read trace's CPU clock
    "tensor": {"models", "training"},
    "pipeline": {"models", "analysis", "text", "launch", "training"},
    "userjob": {"models", "analysis", "dumps", "trace", "launch", "checks"},
    "collectives": {"models", "analysis", "trace", "launch", "userjob"},
    "faultloop": {"models", "analysis", "trace", "launch", "training", "tensor", "pipeline",
                  "checks", "faults"},
    "fixing": set(),
    "teaching": {"models", "analysis", "launch", "userjob", "checks"},
    "testing": {"models", "analysis", "trace", "launch", "userjob", "fixing"},
    "pictures": {"models", "analysis", "memory", "pipeline"},
    "cli": {"models", "analysis", "text", "faults", "memory", "checks", "dumps", "trace",
            "launch", "pipeline",  # (checks: which causes are judged from time)
            "userjob", "collectives", "faultloop", "fixing", "teaching", "pictures"},
    "__main__": {"cli"},  # python -m distdoctor
}


def short(unit: str) -> str:
    return unit.removeprefix("distdoctor.") if unit != "distdoctor" else ""


def documented_layers() -> dict[str, set[str]]:
    """The ``imports:`` line under each package's entry in harness/__init__.py."""
    doc = ast.get_docstring(ast.parse((ROOT / "harness" / "__init__.py").read_text())) or ""
    found, name = {}, None
    for line in " ".join(doc.split("\n")).split("- ``")[1:]:
        name = line.split("``")[0]
        listed = line.split("imports:", 1)[1].strip() if "imports:" in line else None
        assert listed is not None, f"no imports: line for {name}"
        found[name] = set() if listed == "nothing" else {n.strip() for n in listed.split(",")}
    return found


def edges_outside(graph: dict[str, set[str]], layers: dict[str, set[str]]) -> list[str]:
    """Every package-to-package import the table does not allow, and every package the
    table does not name, as 'a -> b'."""
    found = []
    for unit, targets in sorted(graph.items()):
        if not short(unit):
            continue  # distdoctor's own __init__
        allowed = layers.get(short(unit))
        if allowed is None:
            found.append(f"{short(unit)} is not in the table")
            continue
        found += [f"{short(unit)} -> {short(t)}" for t in sorted(targets)
                  if short(t) and short(t) not in allowed]
    return found


def test_the_layer_check_fails_on_an_edge_outside_the_table():
    planted = {"distdoctor.checks": {"distdoctor.models", "distdoctor.training"},
               "distdoctor.newpkg": set(), "distdoctor.models": set()}
    assert edges_outside(planted, LAYERS) == ["checks -> training", "newpkg is not in the table"]


def test_every_package_imports_only_what_the_layer_table_allows():
    graph = package_graph(module_graph())
    assert graph["distdoctor.models"] == set()
    assert edges_outside(graph, LAYERS) == []


def test_the_layer_table_is_the_one_the_package_documents():
    documented = documented_layers()
    assert documented == {k: v for k, v in LAYERS.items() if k != "__main__"}


# userjob's module families (harness/userjob/__init__.py says the same): family -> the
# families it may import
USERJOB_FAMILIES = {"launching": {"inrank", "watching"}, "inrank": {"watching"},
                    "watching": set(), "attaching": set(), "reporting": set(),
                    "resuming": {"launching", "reporting"}}


def test_userjobs_families_import_only_what_their_table_allows():
    """Launching, the in-rank hooks, the watcher, attach and the report each a family of
    its own: a module of one reaching into another outside the table fails here."""
    modules = module_files()
    prefix = "distdoctor.userjob."
    entry = prefix + "__main__"  # python -m distdoctor.userjob: the in-rank bootstrap
    found = {name.removeprefix(prefix).split(".")[0] for name in modules
             if name.startswith(prefix) and name != entry}
    assert found == set(USERJOB_FAMILIES)
    outside = []
    for name, path in modules.items():
        if not name.startswith(prefix) or name == entry:
            continue
        family = name.removeprefix(prefix).split(".")[0]
        for target in imports_of(path, name, set(modules)):
            if target.startswith(prefix):
                other = target.removeprefix(prefix).split(".")[0]
                if other != family and other not in USERJOB_FAMILIES[family]:
                    outside.append(f"{name} -> {target}")
    assert outside == []


def test_no_module_imports_a_generic_top_level_name():
    """Everything imports ``distdoctor.*``: an import of a bare ``checks``, ``faults`` or
    ``harness`` would find a user's package of that name, or nothing once installed."""
    bare = []
    for name, path in module_files().items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                       [node.module or ""] if isinstance(node, ast.ImportFrom)
                       and not node.level else [])
            bare += [f"{name}: {t}" for t in targets
                     if t.split(".")[0] in ("checks", "faults", "harness")]
    assert not bare, bare


def test_at_most_eight_modules_sit_directly_under_harness():
    direct = sorted(p.name for p in (ROOT / "harness").glob("*.py"))
    assert len(direct) <= 8, direct


def test_every_package_opens_with_a_paragraph_on_its_place():
    """Each package says what it does, what it may import and what imports it."""
    for init in sorted((ROOT / "harness").rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc.split()) >= 25, f"{init.relative_to(ROOT)} has no opening paragraph"


@pytest.mark.tier("e2e")  # a fresh interpreter per run of it
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


def test_the_contributing_guide_cites_only_files_and_functions_that_exist():
    """Every `path.py` (and `path.py:function`) docs/contributing.md names is in the tree:
    a guide that sends a newcomer to a file that is gone (it once cited trace/schema.py)
    costs them the search it was written to save."""
    text = (ROOT / "docs" / "contributing.md").read_text()
    cited = set(re.findall(r"([\w/]+\.py)(?::(\w+))?", text))
    assert len(cited) > 20
    homes = (ROOT, ROOT / "harness", ROOT / "harness" / "models")
    missing = []
    for path, function in sorted(cited):
        found = [home / path for home in homes if (home / path).is_file()]
        if path == "__init__.py" or found and (not function or f"def {function}(" in
                                               found[0].read_text()):
            continue
        missing.append(f"{path}:{function}" if function else path)
    assert missing == []
