"""The package map as a test: no import cycles, and every import points down the layers.

The imports are read statically (ast), every one of them: module level, function-local and under
`TYPE_CHECKING`, since a function-local import that closes a circle still ties the two modules together.
An import names the module it reaches: `from a.b import c` reaches `a.b.c` when that is a module, else
`a.b`; the implicit import of a parent package's `__init__` is not counted (every submodule would
otherwise sit in a circle with a package `__init__` that re-exports it).

`LAYERS` is the map docs/CONTRACTS.md and the README describe, bottom first: a module may import its own
area (the longest entry its name starts with) and the areas of lower layers, nothing level or above.
"""

from __future__ import annotations

import ast
import pathlib
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOP_LEVEL = ("porch_jax", "launch", "experiments", "benchmarks", "scripts", "tests")

# Bottom first. Areas in one layer are independent of each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("porch_jax.faults",),  # crash points of the fault tests: the standard library alone, under every layer
    # Leaves: pure Python or JAX alone, nothing of ours but the crash points.
    (
        "porch_jax.protocol",
        "porch_jax.trajectories",
        "porch_jax.kernels",
        "porch_jax.progress",
        "porch_jax.runtime",
        "porch_jax.typed_config",
    ),
    ("porch_jax.models",),  # calls the native kernels on CPU
    ("porch_jax.backends", "porch_jax.serving"),  # the embedded backend samples a model; serving checks parity
    # one loop, losses, batch sources, the one row format, checkpoints: it knows models, no task (rewards, the
    # export's policy file and the rows come from the experiment)
    ("porch_jax.train",),
    ("porch_jax.envs",),  # environments, their scripted policies, benchmarks and scorers
    ("porch_jax.rollout", "porch_jax.attribution"),  # the engine drives envs; the GRM reads records
    ("porch_jax.envs.are.agent",),  # the engine as an agent inside Meta ARE
    ("porch_jax.envs.are.runner",),  # runs that agent over GAIA2 scenarios
    ("porch_jax.rows",),  # record files -> train's rows (launch/train.py): trajectories, rendering, the GRM's context
    ("porch_jax.eval", "porch_jax.maca"),  # evaluation of trained policies; MACA trains through train
    ("porch_jax.opod",),  # the OPOD experiment: rollouts, attribution, training, evaluation
    ("launch", "experiments", "benchmarks", "scripts"),  # entry points and configs: users of the package
    ("tests",),
)

# Areas held to a narrower rule than their layer gives (the README's "serving imports models only, for
# the parity check, and typed_config for its config's resume marks").
ONLY: dict[str, frozenset[str]] = {
    "porch_jax.serving": frozenset({"porch_jax.models", "porch_jax.typed_config"}),
}


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported module of ours
    path: pathlib.Path
    line: int

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _modules() -> dict[str, pathlib.Path]:
    modules = {}
    for top in TOP_LEVEL:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: dict[str, pathlib.Path]) -> str | None:
    """The module of ours `name` reaches (itself, or the nearest enclosing module); None when not ours."""
    if name.split(".")[0] not in TOP_LEVEL:
        return None
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imports(modules: dict[str, pathlib.Path]) -> list[Import]:
    found = []
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for name in names:
                target = _resolve(name, modules)
                if target is not None and target != module:
                    found.append(Import(module, target, path, node.lineno))
    return list(dict.fromkeys(found))  # `from a import b, c` reaching one module twice counts once


def _area(module: str) -> str:
    """The longest LAYERS entry `module` is or lies under; "" when the map does not place it."""
    best = ""
    for layer in LAYERS:
        for area in layer:
            if (module == area or module.startswith(area + ".")) and len(area) > len(best):
                best = area
    return best


def _layer(area: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if area in layer)


def _cycles(imports: list[Import]) -> list[list[Import]]:
    """One circle of imports per strongly connected component of the module graph (Tarjan)."""
    graph: dict[str, dict[str, Import]] = {}
    for imp in imports:
        graph.setdefault(imp.source, {}).setdefault(imp.target, imp)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:  # recursion depth is bounded by the module count (a few hundred)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    circles = []
    for component in components:
        start = min(component)
        # Breadth-first inside the component from start back to start: the shortest circle through it.
        paths: dict[str, list[Import]] = {start: []}
        frontier = [start]
        circle = None
        while frontier and circle is None:
            nxt = []
            for v in frontier:
                for w, imp in sorted(graph.get(v, {}).items()):
                    if w == start:
                        circle = paths[v] + [imp]
                        break
                    if w in component and w not in paths:
                        paths[w] = paths[v] + [imp]
                        nxt.append(w)
                if circle is not None:
                    break
            frontier = nxt
        circles.append(circle)
    return circles


def _circle_text(circle: list[Import]) -> str:
    return "\n".join(f"  {imp.where()}: {imp.source} imports {imp.target}" for imp in circle)


MODULES = _modules()
IMPORTS = _imports(MODULES)


def test_the_walk_sees_the_package():
    # A walk that silently read nothing would pass every rule below.
    assert "porch_jax.models.deltanet" in MODULES and "launch.maca" in MODULES
    assert any(i.source == "porch_jax.models.deltanet" and i.target.startswith("porch_jax.kernels") for i in IMPORTS)
    # Function-local imports count: models/deltanet.py imports its kernels inside the functions that call them.
    local = [i for i in IMPORTS if i.source == "porch_jax.models.deltanet" and i.target == "porch_jax.kernels"]
    assert local, "the function-local `from porch_jax.kernels import ...` in models/deltanet.py was not seen"


def test_no_import_cycles():
    circles = _cycles(IMPORTS)
    if circles:
        pytest.fail(
            "import cycles (move the shared code below both modules):\n" + "\n\n".join(map(_circle_text, circles))
        )


def test_every_module_is_on_the_map():
    unplaced = sorted(m for m in MODULES if m != "porch_jax" and not _area(m))
    assert not unplaced, f"modules in no area of LAYERS (tests/tooling/test_imports.py); place them: {unplaced}"
    # The root package holds no code, so importing it adds no dependency to check.
    assert not [i for i in IMPORTS if i.source == "porch_jax"], "porch_jax/__init__.py imports our modules"


def _against_map(imports: list[Import]) -> list[str]:
    """One line per import that points up or sideways in LAYERS, or outside an area's ONLY set."""
    wrong = []
    for imp in imports:
        source, target = _area(imp.source), _area(imp.target)
        if imp.target == "porch_jax" or not source or not target or source == target:
            continue
        if source in ONLY and target not in ONLY[source]:
            allowed = ", ".join(sorted(ONLY[source]))
            wrong.append(f"{imp.where()}: {imp.source} imports {imp.target} ({source} may import only {allowed})")
        elif _layer(target) >= _layer(source):
            kind = "an area of the same layer" if _layer(target) == _layer(source) else "a higher layer"
            wrong.append(f"{imp.where()}: {imp.source} imports {imp.target} ({source} -> {target}: {kind})")
    return wrong


def test_imports_point_down_the_layers():
    wrong = _against_map(IMPORTS)
    if wrong:
        pytest.fail("imports against the package map (LAYERS in tests/tooling/test_imports.py):\n" + "\n".join(wrong))


def test_the_checks_catch_what_they_guard():
    # The rules on a made-up graph: a circle is found with its file:line, an upward import is named.
    fake = ROOT / "porch_jax" / "x.py"
    a_b = Import("porch_jax.models.a", "porch_jax.models.b", fake, 3)
    b_a = Import("porch_jax.models.b", "porch_jax.models.a", fake, 7)
    (circle,) = _cycles([a_b, b_a, Import("porch_jax.models.a", "porch_jax.kernels", fake, 9)])
    assert {i.line for i in circle} == {3, 7} and "porch_jax/x.py:3" in _circle_text(circle)
    assert _area("porch_jax.envs.are.runner") == "porch_jax.envs.are.runner"
    assert _area("porch_jax.envs.are.env") == "porch_jax.envs"
    assert _layer(_area("porch_jax.protocol.parse")) < _layer(_area("porch_jax.models.qwen3"))
    up = Import("porch_jax.protocol.parse", "porch_jax.models.qwen3", fake, 11)
    side = Import("porch_jax.serving.server", "porch_jax.backends.base", fake, 12)
    down = Import("launch.maca", "porch_jax.maca.train", fake, 13)
    (up_line, side_line) = _against_map([up, side, down])
    assert up_line.startswith("porch_jax/x.py:11: porch_jax.protocol.parse imports porch_jax.models.qwen3")
    assert "higher layer" in up_line and "may import only porch_jax.models" in side_line
