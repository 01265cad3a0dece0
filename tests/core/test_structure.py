"""The shape of ``builder/`` read from its own syntax trees (docs/architecture.md, "Rules"):
imports point down and never round in a circle, between modules or between the top-level
modules and packages a newcomer reads from the folder names; argparse lives in the command
layers only; exactly one module is named ``verify``; imports of the project's own modules sit at
module top unless a comment says why; no function is over 80 lines.

Each rule is checked on the real tree and, so that none of them can pass vacuously, on a small
tree written here that breaks it.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

BUILDER = Path(__file__).resolve().parents[2] / "builder"

# The command layers: build-env's (cli.py, argtypes.py, commands/) and the self-test's own entry
# points, which ship inside images as a separate stdlib-only program (`python -m
# verl_env_selftest`, its rank and worker processes) and so parse their own command lines.
ARGPARSE_ALLOWED = ("cli.py", "argtypes.py", "commands/", "selftest/cli.py",
                    "selftest/launch/rank.py", "selftest/launch/worker.py",
                    "selftest/launch/distributed.py")
MAX_INNER_IMPORTS = 15
MAX_FUNCTION_LINES = 80


@dataclass(frozen=True)
class Module:
    name: str  # builder.x.y
    path: Path
    tree: ast.Module
    lines: tuple[str, ...]


def modules(root: Path) -> dict[str, Module]:
    found: dict[str, Module] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        text = path.read_text()
        found[".".join(parts)] = Module(".".join(parts), path, ast.parse(text),
                                        tuple(text.splitlines()))
    return found


def _targets(mod: Module, node: ast.Import | ast.ImportFrom, known: dict[str, Module],
             package: str) -> Iterator[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = mod.name.split(".")
            if mod.path.name != "__init__.py":
                base = base[:-1]
            base = base[:len(base) - node.level + 1]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        names = [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module
                 for a in node.names]
    for name in names:
        if name.split(".")[0] == package:
            yield name


@dataclass(frozen=True)
class ImportSite:
    module: Module
    node: ast.Import | ast.ImportFrom
    inside_function: bool
    target: str


def import_sites(known: dict[str, Module], package: str) -> Iterator[ImportSite]:
    """Every import of the package's own modules, outside ``if TYPE_CHECKING:`` blocks."""

    def walk(mod: Module, node: ast.AST, in_function: bool) -> Iterator[ImportSite]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _targets(mod, child, known, package):
                    yield ImportSite(mod, child, in_function, target)
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            yield from walk(mod, child, inner)

    for mod in known.values():
        yield from walk(mod, mod.tree, False)


def top_level(name: str) -> str:
    """``builder.gate.image`` -> ``builder.gate``: the module or package under the root."""
    return ".".join(name.split(".")[:2])


def import_graph(known: dict[str, Module], package: str, group: Callable[[str], str] = str
                 ) -> dict[str, set[str]]:
    """Who imports whom, over every import; a node is a module, or what ``group`` maps it to."""
    graph: dict[str, set[str]] = {group(name): set() for name in known}
    for site in import_sites(known, package):
        source, target = group(site.module.name), group(site.target)
        if site.target in known and target != source:
            graph[source].add(target)
    return graph


def cycles(known: dict[str, Module], package: str, group: Callable[[str], str] = str
           ) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan) of the import graph."""
    graph = import_graph(known, package, group)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for name in graph:
        if name not in index:
            visit(name)
    return found


def argparse_users(known: dict[str, Module], root: Path) -> list[str]:
    users = []
    for mod in known.values():
        rel = mod.path.relative_to(root).as_posix()
        if rel.startswith(ARGPARSE_ALLOWED) or rel in ARGPARSE_ALLOWED:
            continue
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.Import) and any(a.name == "argparse" for a in node.names):
                users.append(rel)
            elif isinstance(node, ast.ImportFrom) and node.module == "argparse":
                users.append(rel)
            elif isinstance(node, ast.Attribute) and node.attr == "Namespace":
                users.append(rel)
    return sorted(set(users))


def _justified(site: ImportSite) -> bool:
    """A comment on the import's line or the line above says why it is not at module top."""
    line = site.node.lineno - 1
    around = site.module.lines[max(0, line - 1):line + 1]
    return any("#" in text for text in around)


def long_functions(known: dict[str, Module]) -> list[str]:
    return [f"{mod.path.name}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})"
            for mod in known.values() for node in ast.walk(mod.tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno is not None
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


@pytest.fixture(scope="module")
def tree() -> dict[str, Module]:
    return modules(BUILDER)


def test_no_import_circle(tree: dict[str, Module]) -> None:
    assert cycles(tree, "builder") == []


def test_no_circle_between_top_level_packages(tree: dict[str, Module]) -> None:
    assert cycles(tree, "builder", top_level) == []


def test_argparse_only_in_the_command_layers(tree: dict[str, Module]) -> None:
    assert argparse_users(tree, BUILDER) == []


def test_exactly_one_module_named_verify(tree: dict[str, Module]) -> None:
    named = [name for name in tree if name.rsplit(".", 1)[-1] == "verify"]
    assert named == ["builder.commands.verify"]


def test_imports_inside_functions_are_few_and_justified(tree: dict[str, Module]) -> None:
    inner = [s for s in import_sites(tree, "builder") if s.inside_function]
    where = {f"{s.module.path.relative_to(BUILDER)}:{s.node.lineno}" for s in inner}
    assert len(where) <= MAX_INNER_IMPORTS, sorted(where)
    assert [f"{s.module.path.name}:{s.node.lineno}" for s in inner if not _justified(s)] == []


def test_no_function_over_80_lines(tree: dict[str, Module]) -> None:
    assert long_functions(tree) == []


def rows(known: dict[str, Module], package: str) -> list[set[str]]:
    """The top-level modules and packages in rows, highest first: a node's row is the length
    of its longest chain of imports down to a node that imports nothing of the package."""
    graph = import_graph(known, package, top_level)
    depth: dict[str, int] = {}

    def rank(node: str) -> int:
        if node not in depth:
            depth[node] = 1 + max((rank(d) for d in graph[node]), default=-1)
        return depth[node]

    found: dict[int, set[str]] = {}
    for node in graph:
        found.setdefault(rank(node), set()).add(node.removeprefix(f"{package}."))
    return [found[d] for d in sorted(found, reverse=True)]


def test_the_architecture_picture_is_the_code(tree: dict[str, Module]) -> None:
    """docs/architecture.md draws the rows; the code decides them."""
    doc = (BUILDER.parent / "docs" / "architecture.md").read_text()
    block = doc.split("```\n__main__", 1)[1].split("```", 1)[0]
    drawn = [{"__main__"}] + [{w.rstrip("/") for w in line.split()}
                              for line in block.splitlines()[1:] if line.strip()]
    computed = [row - {"builder"} for row in rows(tree, "builder")]
    assert drawn == [row for row in computed if row]


def test_the_rules_catch_what_they_forbid(tmp_path: Path) -> None:
    """A tree that breaks every rule is caught by every rule (none of them passes vacuously)."""
    pkg = tmp_path / "pkg"
    (pkg / "commands").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "commands" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import argparse\nfrom pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from pkg import a\n    return a\n")
    (pkg / "commands" / "ok.py").write_text("import argparse\n")
    (pkg / "commands" / "down.py").write_text("from pkg import c\n")
    (pkg / "c.py").write_text("from pkg.commands import ok\n")
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (pkg / "long.py").write_text(f"def g():\n{body}")
    known = modules(pkg)
    assert cycles(known, "pkg") == [["pkg.a", "pkg.b"]]
    assert sorted(cycles(known, "pkg", top_level)) == [["pkg.a", "pkg.b"],
                                                       ["pkg.c", "pkg.commands"]]
    assert argparse_users(known, pkg) == ["a.py"]
    inner = [s for s in import_sites(known, "pkg") if s.inside_function]
    assert [(s.module.name, _justified(s)) for s in inner] == [("pkg.b", False)]
    assert long_functions(known) == [f"long.py:1 g ({MAX_FUNCTION_LINES + 1})"]
