"""The adapters use the core through its public names only, no package has an import
cycle, and the core's layers point one way (the engine below the HTTP layer and the
command line, the stores below the engine): the core stays framework-agnostic, each
adapter thin, and each layer usable without the ones above it."""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ADAPTERS = ("anarchon_django", "anarchon_celery", "anarchon_fastapi")

#: Private core modules an adapter still imports, each with why: none. (The Django ORM
#: store hands its connections to the core's SQL stores through the public
#: ``anarchon_core.backends.supply.ConnectionSupply``.)
KNOWN: dict[str, set[str]] = {}


def private_imports(path: Path) -> set[str]:
    """The private ``anarchon_core`` modules and names that ``path`` imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
            names: list[str] = []
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
            names = [alias.name for alias in node.names]
        else:
            continue
        for module in modules:
            if module.split(".")[0] != "anarchon_core":
                continue
            if any(part.startswith("_") for part in module.split(".")):
                found.add(module)
            found.update(f"{module}.{name}" for name in names if name.startswith("_"))
    return found


@pytest.mark.parametrize("package", ADAPTERS)
def test_adapters_import_only_public_core_names(package: str) -> None:
    for path in sorted((ROOT / package).rglob("*.py")):
        relative = str(path.relative_to(ROOT))
        found = private_imports(path)
        assert found <= KNOWN.get(relative, set()), f"{relative} imports private {found}"


def test_the_known_exceptions_are_still_needed() -> None:
    """An exception that is no longer used is removed from the list."""
    for relative, allowed in KNOWN.items():
        assert allowed <= private_imports(ROOT / relative), relative


def imports_of(package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports, at module level or deferred
    inside a function (a deferred import that dodges a cycle is still one); imports
    under ``if TYPE_CHECKING:`` are left out."""
    graph: dict[str, set[str]] = {}
    base = ROOT / package
    for path in base.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package_of = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        targets: set[str] = set()
        for node in _nodes(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = package_of.split(".")
                    anchor = anchor[: len(anchor) - node.level + 1]
                    module = ".".join([*anchor, *(node.module or "").split(".")]).strip(".")
                else:
                    module = node.module or ""
                targets.add(module)
                targets.update(f"{module}.{alias.name}" for alias in node.names)
        graph[name] = {t for t in targets if t.split(".")[0] == package}
    return {m: {t for t in ts if t in graph and t != m} for m, ts in graph.items()}


def _nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` outside ``if TYPE_CHECKING:`` blocks."""
    found: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        found.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return found


@pytest.mark.parametrize("package", ("anarchon_core", *ADAPTERS))
def test_no_import_cycle(package: str) -> None:
    graph = imports_of(package)
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycle = [*path[path.index(module) :], module]
            pytest.fail(f"import cycle: {' -> '.join(cycle)}")
        if module in done:
            return
        for target in sorted(graph[module]):
            # A package's __init__ importing its own modules is not a cycle with them.
            if not module.startswith(target + ".") or target == module:
                visit(target, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def within(*packages: str) -> Callable[[str], bool]:
    """Whether a module is one of ``packages`` or inside one."""
    return lambda module: any(module == p or module.startswith(p + ".") for p in packages)


is_engine = within("anarchon_core.engine")


#: Rule -> (the modules it binds, the modules they must not import).
LAYERS: dict[str, tuple[Callable[[str], bool], Callable[[str], bool]]] = {
    "the engine never imports web or cli": (
        is_engine,
        within("anarchon_core.web", "anarchon_core.cli"),
    ),
    "the stores never import the engine": (within("anarchon_core.backends"), is_engine),
    "web never imports cli": (within("anarchon_core.web"), within("anarchon_core.cli")),
}


def import_chain(
    graph: dict[str, set[str]], start: str, forbidden: Callable[[str], bool]
) -> list[str] | None:
    """The shortest chain of imports from ``start`` to a ``forbidden`` module, directly or
    through other modules, or ``None``. A module's import of its own package (``from .
    import api``) is not followed into that package's ``__init__``, which answers for its
    own imports."""
    paths = {start: [start]}
    todo = [start]
    while todo:
        module = todo.pop(0)
        for target in sorted(graph[module]):
            if target in paths or module.startswith(target + "."):
                continue
            paths[target] = [*paths[module], target]
            if forbidden(target):
                return paths[target]
            todo.append(target)
    return None


@pytest.mark.parametrize("rule", sorted(LAYERS))
def test_a_layer_never_imports_the_layers_above_it(rule: str) -> None:
    bound, forbidden = LAYERS[rule]
    graph = imports_of("anarchon_core")
    assert any(bound(m) for m in graph), f"{rule}: no module is bound by it"
    chains = [import_chain(graph, m, forbidden) for m in sorted(graph) if bound(m)]
    found = [chain for chain in chains if chain is not None]
    assert not found, f"{rule}: {' -> '.join(min(found, key=len))}"


#: The core's modules that give a module of ``web`` a shorter import path.
SHORT_PATHS = {
    "anarchon_core.api": "anarchon_core.web.api",
    "anarchon_core.endpoints": "anarchon_core.web.endpoints",
    "anarchon_core.http_guard": "anarchon_core.web.http_guard",
}


@pytest.mark.parametrize(("short", "module"), sorted(SHORT_PATHS.items()))
def test_a_short_path_exports_what_its_module_does(short: str, module: str) -> None:
    alias, target = importlib.import_module(short), importlib.import_module(module)
    assert alias.__all__ == target.__all__
    for name in target.__all__:
        assert getattr(alias, name) is getattr(target, name), f"{short}.{name}"
