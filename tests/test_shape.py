"""The package's shape, measured: no import cycle, no module over 600 lines, and asyncio code
that only drives protocols.

Every operation is written once as a protocol (``django_redislua/protocol.py``) and run by one of
two drivers; what must stay ``async def`` with control flow of its own is the asyncio driver,
the asyncio transports' send-once primitives and the ASGI entry points. Both numbers are
printed by ``python -m pytest tests/test_shape.py -s`` (and by ``python tests/test_shape.py``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
PACKAGE = Path(__file__).resolve().parent.parent / "django_redislua"
# Statements and expressions that make a function's path through it depend on something.
CONTROL_FLOW = (ast.If, ast.IfExp, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.With,
                ast.AsyncWith, ast.Match, ast.comprehension, ast.BoolOp, ast.TryStar)
MOST_ASYNC_WITH_CONTROL_FLOW = 10


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _own_nodes(function: ast.AST) -> list[ast.AST]:
    """The nodes of ``function``'s own body, not those of functions defined inside it."""
    nodes, todo = [], list(ast.iter_child_nodes(function))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        nodes.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return nodes


def async_with_control_flow() -> list[str]:
    """``module:line name`` of every ``async def`` whose own body has control flow."""
    found = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.AsyncFunctionDef) and any(
                    isinstance(n, CONTROL_FLOW) for n in _own_nodes(node)):
                found.append(f"{name}:{node.lineno} {node.name}")
    return found


def imports() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at module level, inside functions (an
    import deferred into a function to dodge a cycle is a cycle all the same) or for type
    checking only (``if TYPE_CHECKING:``: two modules that must be read together to be
    understood are knotted, whatever runs first). The root package (whose ``__init__``
    imports nothing eagerly) is left out."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text())
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1],
                                     *([base] if base else [])])
                # ``from pkg import sub`` depends on the submodule; ``from pkg import name`` on
                # the package's own code (its __init__).
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.add(sub if sub in known else base)
        graph[name] = {t for t in targets if t in known and t != name and t != "django_redislua"}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_no_import_cycle() -> None:
    found = cycles(imports())
    print(f"\nimport cycles in the package: {len(found)}")
    assert found == []


MOST_LINES = 600  # issue 36: a module a reader can hold in mind


def test_no_module_is_over_600_lines() -> None:
    longest = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    over = {name: lines for name, lines in longest.items() if lines > MOST_LINES}
    print(f"\nlongest module: {max(longest.values())} lines")
    assert over == {}


def test_asyncio_code_only_drives_protocols() -> None:
    found = async_with_control_flow()
    print(f"\nasync def with control flow of their own: {len(found)}")
    for entry in found:
        print("  ", entry)
    assert len(found) <= MOST_ASYNC_WITH_CONTROL_FLOW


def test_the_measures_see_what_they_measure(tmp_path: Path) -> None:
    """The counters find a cycle through a deferred import, and control flow in an ``async
    def`` but not in one defined inside it."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    tree = ast.parse("async def f():\n    async def g():\n        if x: pass\n    return 1\n")
    outer = tree.body[0]
    assert not any(isinstance(n, CONTROL_FLOW) for n in _own_nodes(outer))
    assert any(isinstance(n, CONTROL_FLOW) for n in _own_nodes(outer.body[0]))  # type: ignore[attr-defined]


if __name__ == "__main__":
    print("import cycles:", cycles(imports()))
    flows = async_with_control_flow()
    print(f"async def with control flow ({len(flows)}):", *flows, sep="\n  ")
