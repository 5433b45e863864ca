"""The house has no circle: between its parts (each subpackage, and each top-level module of
transientvod/) imports run one way, lazy imports inside functions included. A circle is what
made checkpoint.py and checkpoint_s3.py import each other; this test names the next one."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "transientvod"


def part_of(module: str) -> str:
    """'transientvod.spot.provisioning.fleet' -> 'spot', 'transientvod.worker.train' -> 'train'."""
    return module.split(".")[1]


def imports_between_parts() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if module == "transientvod.__init__":
            continue
        part = part_of(module)
        graph.setdefault(part, set())
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module == "transientvod":
                names = [f"transientvod.{alias.name}" for alias in node.names]  # from transientvod import ops
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            else:
                continue
            graph[part] |= {part_of(name) for name in names if name.startswith("transientvod.")} - {part}
    return graph


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """A path that comes back to where it started, or None (depth-first, three colours)."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        for nxt in sorted(graph.get(node, ())):
            circle = visit(nxt, path + [node])
            if circle:
                return circle
        done.add(node)
        return None

    for start in sorted(graph):
        circle = visit(start, [])
        if circle:
            return circle
    return None


def test_the_parts_of_the_package_import_one_way():
    graph = imports_between_parts()
    assert {"config", "head", "worker", "gradients", "spot", "checkpoint", "tracking"} <= set(graph)  # the walk saw the house
    circle = find_circle(graph)
    assert circle is None, "an import circle: " + " -> ".join(circle)


def test_find_circle_finds_one():
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_config_is_the_bottom_of_the_house():
    assert imports_between_parts()["config"] == set()


# The house's size rules (issue 52): at most six modules at the package's root, and no module
# over 400 lines (a module that grows past it has grown a second job: split it).
ROOT_MODULES_MAX = 6
LINES_MAX = 400


def test_at_most_six_modules_at_the_package_root():
    root = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(root) <= ROOT_MODULES_MAX, f"{len(root)} modules at transientvod/'s root: {root}"


def test_no_module_over_400_lines():
    lines = {str(path.relative_to(PACKAGE)): len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")}
    over = {name: count for name, count in lines.items() if count > LINES_MAX}
    assert not over, f"modules over {LINES_MAX} lines: {over}; split them"
