"""No import loops in the package, and no import that runs back up its layers: walks every module's
imports (read with ``ast``, nothing is imported) and fails on any cycle or any upward import, naming it.

Every import counts, wherever it sits: at module level, inside a function, or under
``if TYPE_CHECKING:``. A function-level or type-only import does not make a loop go away; it only
stops it from failing at import time, and leaves two modules that cannot be read, tested or moved
one without the other (``config → registry → component → config`` hid that way). Implicit imports of
parent packages (``import a.b`` runs ``a/__init__``) are not edges: they are how Python finds a
module, not a dependency of the code.

``sources/`` and ``sinks/`` are walked under their installed names (``cuptistream.sources``/``.sinks``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"cuptistream": ROOT / "cuptistream", "cuptistream.sources": ROOT / "sources",
            "cuptistream.sinks": ROOT / "sinks"}  # fmt: skip


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = [p for p in path.relative_to(folder).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports, anywhere in its body."""
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for alias in node.names:  # `from a import b` imports the module a.b where there is one
                targets.add(f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in modules else origin)
    edges = set()
    for target in targets:
        while target and target not in modules:  # `import a.b.c as x` of a name inside a module
            target = target.rpartition(".")[0]
        if target and target != name:
            edges.add(target)
    return edges


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as a loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
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


def _loop(graph: dict[str, set[str]], members: list[str]) -> str:
    """One concrete loop through a component, for the message: ``a → b → c → a``."""
    inside = set(members)
    start = members[0]
    path, seen = [start], {start}
    while True:
        nxt = sorted(graph[path[-1]] & inside)
        back = start in nxt
        if back:
            return " → ".join([*path, start])
        step = next((n for n in nxt if n not in seen), None)
        if step is None:
            return " ↔ ".join(members)
        if start in graph[step]:
            return " → ".join([*path, step, start])
        path.append(step)
        seen.add(step)


def test_the_walk_sees_the_package() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert "cuptistream.sources.activity" in modules and "cuptistream.cupti.library" in modules
    assert "cuptistream.cupti.library" in graph["cuptistream.cupti.driver"]
    assert "cuptistream.sources.cupti_worker" in graph["cuptistream.sources.pc_sampling.source"]  # `..`
    assert "cuptistream.sources.pc_sampling.source" in graph["cuptistream.sources.pc_sampling"]  # `.`


def test_no_import_cycles() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    loops = [_loop(graph, members) for members in _cycles(graph)]
    assert not loops, "import cycles:\n" + "\n".join(loops)


# The package's rooms, lowest first. A module may import its own room and the rooms of lower layers;
# an import of a room in its own layer or a higher one fails. The room of ``cuptistream.X.…`` is X;
# the package's ``__init__`` is "".
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "events", "protowire"),
    ("config",),
    # CUPTI bindings and record readers; the probe-collector channel; the launching threads' stacks
    # (below the statistics, which join GPU work to them)
    ("channel", "cupti", "delivery", "stacks"),
    # encoding, framing, reading back; the overhead governor; NVML's GPM (answers as CUPTI's PM sampling)
    ("recording", "statistics", "overhead", "nvml"),
    ("plugin",),  # the contract every source and sink imports
    ("pipeline",),  # the intake and the trio pipeline (the probe uses the intake)
    ("probe", "sources", "sinks"),
    ("collector",),
    ("analysis", "warehouse"),  # the views, and the warehouse's schema and queries
    ("run",),  # a probe and a collector put together
    ("node",),  # the start hook installed into job environments (checks collectors, as `run` starts probes)
    ("attach",),  # a probe loaded into a running process (reads the node install, runs a collector)
    ("cli", ""),
)


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_room_has_a_layer() -> None:
    rooms = {_room(name) for name in _modules()}
    placed = [room for layer in LAYERS for room in layer]
    assert len(placed) == len(set(placed)), "a room is in two layers"
    assert rooms == set(placed), f"rooms without a layer: {sorted(rooms - set(placed))}"


def test_no_import_runs_back_up_the_layers() -> None:
    modules = _modules()
    layer = {room: n for n, rooms in enumerate(LAYERS) for room in rooms}
    upward = []
    for name, path in modules.items():
        for target in _imports(name, path, modules):
            here, there = _room(name), _room(target)
            if here != there and layer[there] >= layer[here]:
                upward.append(f"{name} → {target}")
    assert not upward, "imports that run back up the layers:\n" + "\n".join(sorted(upward))
