"""No import circles among roll's modules.

A static scan, stdlib ``ast`` only: every module under ``packages/*/src`` is parsed and every ``import`` in it
becomes an edge of the module graph, wherever it sits (module level, inside a function, under
``if TYPE_CHECKING:``): a lazy import still ties the two modules together, it only hides the tie from the
interpreter. ``from a.b import c`` points at the module ``a.b.c`` when there is one, else at ``a.b``; ``import
a.b.c`` points at ``a.b.c``. Edges to a package's parents (which Python also runs) are not counted: every
submodule would otherwise sit in a circle with an ``__init__`` that re-exports it. Circles are the strongly
connected components of more than one module (Tarjan).

One layout is exempt, and only it: a plugin package whose ``__init__`` holds its config and ``SPEC`` builds the
pipeline by importing its own ``pipeline`` submodule inside a function (the spec's ``build``), and that
``pipeline`` module imports the config back. The exempt edge is exactly ``P -> P.pipeline`` where ``P`` is a
package ``__init__`` and the import sits inside a function body; the edge back is counted as usual, and so is any
other module-level or lazy import.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, Path]:
    """Module name -> file, for every module of every workspace package."""
    found: dict[str, Path] = {}
    for src in sorted(ROOT.glob("packages/*/src")):
        for path in sorted(src.rglob("*.py")):
            parts = path.relative_to(src).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _imports(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement in ``tree`` with whether it sits inside a function body."""

    def visit(node: ast.AST, in_function: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, in_function
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            yield from visit(child, inner)

    yield from visit(tree, False)


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The workspace modules one import statement points at."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    base = node.module or ""
    if node.level:
        package = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    out = set()
    for alias in node.names:
        if f"{base}.{alias.name}" in known:
            out.add(f"{base}.{alias.name}")
        elif base in known:
            out.add(base)
    return out


def _is_plugin_layout(module: str, target: str, is_package: bool, in_function: bool) -> bool:
    return is_package and in_function and target == f"{module}.pipeline"


def import_graph() -> dict[str, set[str]]:
    """Module -> the workspace modules it imports (the plugin-layout edge left out)."""
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, in_function in _imports(tree):
            for target in _targets(node, name, is_package, known):
                if target != name and not _is_plugin_layout(name, target, is_package, in_function):
                    graph[name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
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
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(found)


def test_circles_finds_a_circle_and_only_circles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_scan_sees_lazy_and_type_checking_imports_and_exempts_only_the_plugin_layout() -> None:
    graph = import_graph()
    assert len(graph) > 250, "the scan found too few modules; is the src layout still packages/*/src?"
    # a function-level import (the spec's preflight) and one under `if TYPE_CHECKING:`
    assert "roll.pipelines.preflight" in graph["roll.pipelines.rlvr"]
    assert "roll.core.batch" in graph["roll.core.samples"]
    # the plugin layout: the package's lazy import of its own `pipeline` is left out, the edge back is kept
    assert "roll.pipelines.rlvr.pipeline" not in graph["roll.pipelines.rlvr"]
    assert "roll.pipelines.sft" in graph["roll.pipelines.sft.pipeline"]


def test_no_import_circles() -> None:
    found = circles(import_graph())
    listing = "\n".join("  " + " <-> ".join(c) for c in found)
    assert not found, (
        f"import circles among roll's modules:\n{listing}\n"
        "Move what both sides need into a module both import (a lazy or TYPE_CHECKING import does not count "
        "as a fix); the one exempt layout is described in tests/test_import_cycles.py."
    )
