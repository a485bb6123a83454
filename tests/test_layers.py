"""The house imports only downward. Every import in the package (inside functions too) is read with
`ast` and checked against the layer list below; the one circle allowed is Tensor ↔ ops: Tensor's
operators call the ops, and the ops (through Function.apply, which wraps their results) make Tensors."""

import ast
import pathlib

import tinygrad_ckpt

PACKAGE = pathlib.Path(tinygrad_ckpt.__file__).parent

# bottom to top; a module may import modules of lower layers, and inside the circle, each other
LAYERS = [
    {"units", "palette", "checks", "events"},  # import nothing (checks: a caller's arguments; events: the ledger's
    # records, stored compactly)
    {"cuda_allocator", "devices"},  # PyTorch's CUDA caching allocator, simulated; the GPUs' memory (units only)
    {"state", "planner", "estimate"},  # per-thread state; pure formulas and plans
    {"backend"},  # numpy, cupy, meta: the only code that knows an array library
    {"observe"},  # the observers: how tools watch the engine
    {"tape"},  # entries, graphs, the backward loop
    {"tensor", "function", "ops"},  # the circle: Tensor <-> ops
    {"functional", "optim", "debug", "amp"},  # amp: tg.autocast  # debug: pdb breakpoints and anomaly checks, observers
    {"policies", "early_stop", "replay_check"},  # the checkpoint's features, each an observer of its segment
    {"checkpoint"},  # a client of the core: the segment operator
    {"nn"},  # GPT(checkpoint=...) runs plans through checkpoint
    {"parallel", "explorer", "memory_viz"},  # one device's shard of a parallel GPT; the ledger's HTML page and
    # memory_viz snapshot, from plain event data
    {"exports"},  # what Ledger.to_* write: Chrome trace, CSV, JSONL, memory_viz, the explorer page
    {"ledger"},  # an observer
    {"plots", "measure", "torch_bridge"},  # torch_bridge: plans applied to PyTorch (optional extra [torch])
    {"torch_plans", "torch_weights"},  # the plans on any PyTorch model; weights by name (optional extra [torch])
    {"torch_dist"},  # the plans on a model split over processes (torchrun)
    {"tapeview", "report"},  # tape entries as a table and a drawing (draws with plots); what `estimate` prints
    {"figures"},
    {"notebooks", "apidoc"},  # the lessons as notebooks; docs/api.md from the docstrings
    {"cli"},
]
CIRCLE = {"tensor", "function", "ops"}
CORE = {"units", "checks", "state", "backend", "observe", "tape", "tensor", "function", "ops"}
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def _unit(module: str) -> str:
    """'tinygrad_ckpt.backend.meta' -> 'backend' (the room a module belongs to)."""
    return module.split(".")[1] if module.count(".") else ""


def _imports():
    """(importing unit, imported unit, file, line) for every import of a package module."""
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                targets = [prefix] if node.module else [f"{prefix}.{a.name}" for a in node.names]
            for target in targets:
                if target.startswith("tinygrad_ckpt.") and _unit(module) and _unit(target) != _unit(module):
                    yield _unit(module), _unit(target), path.name, node.lineno


def test_every_module_has_a_layer():
    units = {_unit(f"tinygrad_ckpt.{p.relative_to(PACKAGE).with_suffix('').parts[0]}")
             for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE}
    assert units <= set(RANK), f"place these in LAYERS: {sorted(units - set(RANK))}"


# upward imports allowed, each with why
FORWARDED = {("torch_bridge", "torch_plans"): "the contract's torch_bridge.apply_plan/remove_plan, forwarded lazily "
                                              "by a module __getattr__ to where they live"}


def test_imports_only_go_down():
    upward = [f"{path}:{line}: {src} imports {dst}" for src, dst, path, line in _imports()
              if (RANK[dst] > RANK[src] or (RANK[dst] == RANK[src] and not {src, dst} <= CIRCLE))
              and (src, dst) not in FORWARDED]
    assert upward == [], "\n".join(upward)


def test_the_core_imports_nothing_above_it():
    found = [f"{path}:{line}: {src} imports {dst}" for src, dst, path, line in _imports()
             if src in CORE and dst not in CORE]
    assert found == [], "\n".join(found)


def test_the_checker_sees_imports_inside_functions(tmp_path):
    tree = ast.parse("def f():\n    from .ledger import Ledger\n")
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    assert node.module == "ledger" and node.level == 1
    assert any(src == "torch_dist" and dst == "torch_plans" for src, dst, _, _ in _imports())  # inside a function
