"""The packages stack one way (ARCHITECTURE.md): no import runs back up, no module imports itself in a circle.

Read from the source with ``ast`` (every import, lazy ones inside functions included), so a cycle
that only bites when a rarely used function runs is found too.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Bottom first: a package may import the ones before it in this list, never the ones after it.
LAYERS = ["schemas", "collectors", "trainer", "serving", "pipelines", "viewer", "agentlake"]


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _product_modules() -> dict[str, set[str]]:
    modules = {_module_name(p): p for layer in LAYERS for p in (REPO / layer).rglob("*.py")}
    return {name: {m for m in _imports(path) if m in modules} for name, path in modules.items()}


def test_no_package_imports_one_above_it_or_the_examples() -> None:
    wrong = []
    for layer_index, layer in enumerate(LAYERS):
        for path in (REPO / layer).rglob("*.py"):
            for imported in _imports(path):
                top = imported.split(".")[0]
                if top == "examples" or (top in LAYERS and LAYERS.index(top) > layer_index):
                    wrong.append(f"{path.relative_to(REPO)} imports {imported}")
    assert not wrong, "imports that run back up:\n" + "\n".join(sorted(wrong))


def test_no_import_cycle_between_product_modules() -> None:
    graph = _product_modules()
    # A package's __init__ is imported by its own modules' imports; count only edges between modules.
    edges = {m: {d for d in deps if d != m and not m.startswith(d + ".")} for m, deps in graph.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(edges[node]):
            if state.get(dep) == 1:
                cycles.append([*path[path.index(dep) :], dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_checker_sees_a_cycle_and_an_upward_import(tmp_path: Path) -> None:
    """The two checks above can fail: the same reading finds what they look for in a made-up tree."""
    (tmp_path / "schemas").mkdir()
    bad = tmp_path / "schemas" / "bad.py"
    bad.write_text("def f():\n    from pipelines.bronze.ingest import ingest\n    from . import other\n")
    global REPO
    saved, REPO = REPO, tmp_path
    try:
        assert _imports(bad) == {
            "pipelines.bronze.ingest",
            "pipelines.bronze.ingest.ingest",
            "schemas",
            "schemas.other",
        }
    finally:
        REPO = saved


# The pipelines' rooms stack the same way, in the order data flows: bronze reads Kafka, silver reads bronze's
# tables, gold reads silver's; the lake operations act on all of them, and the Dagster wiring (defs) on everything.
# Modules at the top of pipelines/ (keys, steps, errors) are shared by every room.
ROOMS = ["bronze", "silver", "gold", "lake", "defs"]


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "pipelines" and parts[1] in ROOMS else None


def test_pipelines_rooms_import_only_rooms_upstream_of_them() -> None:
    wrong = []
    for room in ROOMS:
        for path in (REPO / "pipelines" / room).rglob("*.py"):
            for imported in _imports(path):
                other = _room(imported)
                if other is not None and ROOMS.index(other) > ROOMS.index(room):
                    wrong.append(f"{path.relative_to(REPO)} imports {imported}")
    assert not wrong, "pipelines rooms importing downstream:\n" + "\n".join(sorted(wrong))


def test_shared_pipelines_modules_import_no_room() -> None:
    """keys, steps and errors sit under every room: none of them may import one (the package's __init__,
    which names the Dagster definitions, excepted)."""
    shared = [p for p in (REPO / "pipelines").glob("*.py") if p.name != "__init__.py"]
    assert shared
    wrong = [f"{p.relative_to(REPO)} imports {m}" for p in shared for m in _imports(p) if _room(m) is not None]
    assert not wrong, "\n".join(wrong)
