"""BUILD must describe the tree: Bazel cannot run here, so this is what keeps its targets honest."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _targets() -> list[dict]:
    """Evaluates BUILD's Starlark calls with stand-ins that record each rule's arguments."""
    targets: list[dict] = []

    def rule(kind):
        def record(**kwargs):
            targets.append({"kind": kind, **kwargs})

        return record

    env = {
        "load": lambda *a, **k: None,
        "package": lambda **k: None,
        "requirement": lambda name: f"@pypi//{name}",
        "glob": lambda patterns: [p for pat in patterns for p in ROOT.glob(pat)],
        "py_library": rule("py_library"),
        "py_binary": rule("py_binary"),
        "py_test": rule("py_test"),
    }
    source = (ROOT / "BUILD").read_text(encoding="utf-8")
    tree = ast.parse(source, "BUILD")  # Starlark BUILD files are valid Python syntax.
    exec(compile(tree, "BUILD", "exec"), env)
    return targets


def test_build_is_generated_from_tree():
    result = subprocess.run(
        [sys.executable, "scripts/gen_build.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_every_test_file_and_launch_script_has_a_target():
    targets = _targets()
    tests = {t["srcs"][0] for t in targets if t["kind"] == "py_test"}
    binaries = {t["srcs"][0] for t in targets if t["kind"] == "py_binary"}
    on_disk_tests = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")}
    on_disk_launch = {p.relative_to(ROOT).as_posix() for p in (ROOT / "launch").glob("*.py") if p.name != "__init__.py"}
    assert tests == on_disk_tests
    assert binaries == on_disk_launch


def test_every_named_source_exists_and_names_are_unique():
    targets = _targets()
    names = [t["name"] for t in targets]
    assert len(names) == len(set(names))
    for t in targets:
        for src in t.get("srcs", []):
            path = src if isinstance(src, pathlib.Path) else ROOT / src
            assert path.exists(), f"{t['name']}: {src} does not exist"
    library = next(t for t in targets if t["name"] == "porch_jax")
    package_files = set((ROOT / "porch_jax").rglob("*.py"))
    assert package_files and package_files <= set(library["srcs"])
