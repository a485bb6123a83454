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
    {"trees"},  # nested arguments mapped leaf by leaf (the checkpoint's arguments and outputs)
    {"checkpoint"},  # a client of the core: the segment operator
    {"checkpoint_plans"},  # blocks run under a plan, each checkpointed segment through checkpoint
    {"nn"},  # GPT(checkpoint=...) runs plans through checkpoint
    {"parallel", "explorer", "memory_viz"},  # one device's shard of a parallel GPT; the ledger's HTML page and
    # memory_viz snapshot, from plain event data
    {"exports"},  # what Ledger.to_* write: Chrome trace, CSV, JSONL, memory_viz, the explorer page
    {"ledger"},  # an observer
    {"plots", "measure", "torch_saves", "torch_weights"},  # torch_saves: plans run in PyTorch, its saves measured;
    # torch_weights: weights by name into PyTorch models (optional extra [torch], as every torch_* module)
    {"torch_plans"},  # the engine's plans on any torch.nn.Module
    {"torch_bridge"},  # a GPT and a Llama in PyTorch with the engine's names; re-exports torch_plans' calls
    {"torch_dist"},  # the plans on torch.distributed (DTensor, FSDP2), per rank against the estimate
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


def test_imports_only_go_down():
    upward = [f"{path}:{line}: {src} imports {dst}" for src, dst, path, line in _imports()
              if RANK[dst] > RANK[src] or (RANK[dst] == RANK[src] and not {src, dst} <= CIRCLE)]
    assert upward == [], "\n".join(upward)


def test_the_core_imports_nothing_above_it():
    found = [f"{path}:{line}: {src} imports {dst}" for src, dst, path, line in _imports()
             if src in CORE and dst not in CORE]
    assert found == [], "\n".join(found)


def test_the_checker_sees_imports_inside_functions(tmp_path):
    tree = ast.parse("def f():\n    from .ledger import Ledger\n")
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    assert node.module == "ledger" and node.level == 1
    assert any(src == "tapeview" and dst == "plots" for src, dst, _, _ in _imports())  # a function-level import
