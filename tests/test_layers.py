"""The package's shape is a rule, not a habit: imports point one way down the layers, and nothing imports in a
circle. docs/architecture.md draws the same map.

Layers, top to bottom (a module may import from lower layers and from its own subpackage, never upwards and
never sideways into another subpackage of its own layer):

    cli
    finetune | rl (fine-tuning and reinforcement learning run on the Trainer)
    bench (measures every layer below it)
    train | serve | inspect
    api (the facade) | eval
    data | inference | export
    tokenizer | weights | cpu (the CPU inference runtime)
    model | weights.hub (the one network boundary)
    config | runtime
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "src" / "gpt2"

LAYERS: list[tuple[str, ...]] = [
    ("gpt2.config", "gpt2.runtime"),
    ("gpt2.model", "gpt2.weights.hub"),
    ("gpt2.tokenizer", "gpt2.weights", "gpt2.cpu"),
    ("gpt2.data", "gpt2.inference", "gpt2.export"),
    ("gpt2.api", "gpt2.eval"),
    ("gpt2.train", "gpt2.serve", "gpt2.inspect"),
    ("gpt2.finetune", "gpt2.rl"),
    ("gpt2.bench",),
    ("gpt2.cli",),
]


def module_name(path: Path) -> str:
    parts = ["gpt2", *path.relative_to(PACKAGE_ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE_ROOT.rglob("*.py"))}


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """Every gpt2 module `path` imports anywhere (top level, functions, TYPE_CHECKING blocks)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from gpt2.x import y` imports the module gpt2.x.y when y is one, else a name of gpt2.x
            names = [
                f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known else node.module
                for alias in node.names
            ]
        else:
            continue
        found.update(name for name in names if name in known)
    return found


def owner(module: str) -> tuple[int, str]:
    """(layer index, the layer entry that owns `module`): the longest matching prefix wins."""
    matches = [
        (len(entry), index, entry)
        for index, layer in enumerate(LAYERS)
        for entry in layer
        if module == entry or module.startswith(entry + ".")
    ]
    if not matches:
        raise AssertionError(f"{module} belongs to no layer; add it to LAYERS here and to docs/architecture.md")
    _, index, entry = max(matches)
    return index, entry


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    known = set(modules)
    return {name: imported_modules(path, known) - {name} for name, path in modules.items() if name != "gpt2"}


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    problems = []
    for module, targets in sorted(graph.items()):
        layer, entry = owner(module)
        for target in sorted(targets):
            if target == "gpt2":
                problems.append(f"{module} imports the top-level package gpt2 (import from the owning module)")
                continue
            target_layer, target_entry = owner(target)
            same_package = (
                target_entry == entry or target.startswith(entry + ".") or module.startswith(target_entry + ".")
            )
            if target_layer > layer or (target_layer == layer and not same_package):
                problems.append(f"{module} (layer {layer}) imports {target} (layer {target_layer})")
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
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
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_module_belongs_to_a_layer() -> None:
    for module in all_modules():
        if module != "gpt2":
            owner(module)


def test_imports_point_down_the_layers() -> None:
    assert layer_violations(import_graph()) == []


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_model_imports_only_config() -> None:
    assert import_graph()["gpt2.model"] <= {"gpt2.config"}


def test_the_checks_catch_an_upward_import_and_a_cycle() -> None:
    graph = {"gpt2.model": {"gpt2.inference.generation"}, "gpt2.inference.generation": {"gpt2.model"}}
    assert layer_violations(graph) == ["gpt2.model (layer 1) imports gpt2.inference.generation (layer 3)"]
    assert cycles(graph) == [["gpt2.inference.generation", "gpt2.model"]]


def test_a_sideways_import_between_packages_of_one_layer_is_refused() -> None:
    assert layer_violations({"gpt2.data.core": {"gpt2.inference.generation"}}) == [
        "gpt2.data.core (layer 3) imports gpt2.inference.generation (layer 3)"
    ]


@pytest.mark.parametrize("module", ["gpt2.weights.hub"])
def test_network_boundary_sits_below_everything_that_downloads(module: str) -> None:
    assert owner(module) == (1, module)
