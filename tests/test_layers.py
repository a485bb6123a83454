"""The house imports only downward. Every import in the package (inside functions too) is read with
`ast` and checked against the folder list below; the one circle allowed is engine ↔ ops: Tensor's
operators call the ops, and the ops (through Function.apply, which wraps their results) make Tensors."""

import ast
import pathlib

import tinygrad_ckpt

PACKAGE = pathlib.Path(tinygrad_ckpt.__file__).parent

# bottom to top, one entry per folder (or per top-level module); a module may import modules of lower entries and of
# its own folder; the one circle between entries is engine <-> ops
LAYERS = [
    {"units", "checks", "state"},  # import nothing: formatting, a caller's arguments, the per-thread state
    {"backend"},  # numpy, cupy, meta: the only code that knows an array library
    {"engine", "ops"},  # the learner's engine (Tensor, Function, the tape, the observers) and its ops: the circle
    {"functional", "optim", "amp", "debug"},  # the user's building blocks
    {"recompute"},  # the segment operator, its policies, early stop, replay check, plans, the planner
    {"nn"},  # GPT and Llama modules (checkpoint= runs plans through recompute)
    {"memory"},  # the ledger and its collaborators, its exports, the explorer, plots, the allocator simulation
    {"scale"},  # the estimate, measured steady steps on meta, parallel shards, devices, the report
    {"torch_bridge"},  # PyTorch: the engine's plans on any nn.Module, saved bytes, weights, torch.distributed
    {"app"},  # the tinygrad-ckpt command, figures, notebooks, the API page
]
CIRCLE = {"engine", "ops"}
CORE = {"units", "checks", "state", "backend", "engine", "ops"}
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


def test_the_checker_sees_imports_inside_functions():
    seen = {(path, line) for _, _, path, line in _imports()}
    inside = []
    for path in PACKAGE.rglob("*.py"):
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, ast.FunctionDef):
                inside += [(path.name, n.lineno) for n in ast.walk(fn)
                           if isinstance(n, ast.ImportFrom) and n.level >= 2]  # reaches another folder
    assert inside and set(inside) <= seen
