"""No private name of a library (Lightning, torch, wandb_workspaces, huggingface_hub, ...) in
src/repgeom, read from the source with `ast`: a minor release may rename or drop a `_name`
without notice, so each one that remains is listed in `EXCEPTIONS` with its reason.

A name is private when it starts with one underscore (``__dunder__`` names are public). Found:

- imports of a private name or from a private module of a library
  (``from lightning.x import _y``, ``import torch._dynamo``, ``from huggingface_hub.utils._http``);
- ``importlib.import_module("torch._dynamo")``: a library's private module;
- ``operator.attrgetter("_name")``, ``vars(obj)["_name"]``, ``obj.__dict__["_name"]`` as
  ``obj._name`` below;
- ``obj._name`` (and ``getattr(obj, "_name")``, setattr, hasattr, delattr) where ``obj`` is a
  library's module (``torch._C``), or ``_name`` is not one repgeom defines itself (a function,
  class, module or class attribute, or an attribute its own objects set), e.g.
  ``trainer._logger_connector``, ``logger._offline``, ``tensor._version``;
- in a class that extends a library's class (a class nested in a function too):
  ``self._name``, ``super()._name`` and method definitions ``def _name`` where the library's
  class (any class of its MRO) has ``_name``, e.g. an
  override of ``ThroughputMonitor._update`` or a read of its ``self._throughputs``.

repgeom's own private names (``repgeom.metrics._validation``, ``self._cache`` of its own classes)
are not counted.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from collections import Counter
from functools import cache
from pathlib import Path

from source_imports import from_module

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "repgeom"
OURS = "repgeom"

EXCEPTIONS: dict[tuple[str, str], str] = {
    ("models/lightning_module.py", "_batches_that_stepped"): (
        "the loggers' step: Lightning has no public setter, and a checkpoint written mid-step "
        "(SLURM's signal) restores it one step off global_step; the key is part of the "
        "checkpoint format its migrations keep (utilities/migration)"),
    ("callbacks/progress_bar.py", "_get_train_description"): (
        "RichProgressBar has no public hook for the bar's description, which reads 'Epoch 0/-2' "
        "in a max_steps run; tests/test_ecosystem.py sees it"),
    ("console.py", "_wandb_init"): (
        "Lightning's WandbLogger passes anonymous=None to wandb.init (no option leaves it out) "
        "and wandb >= 0.22 warns for it; read with getattr(..., None): gone, it does nothing"),
    ("dashboard.py", "_spec"): (
        "wandb_workspaces serialises a Workspace only to upload it (`save`); `specification` is "
        "the dry run that shows what would be uploaded"),
    ("metrics/_spectrum.py", "_version"): (
        "torch's in-place version counter (autograd's notes name it): no public API says "
        "whether a tensor was changed in place, and the spectrum cache must not outlive that"),
    ("models/hub/calls.py", "huggingface_hub.utils._http"): (
        "default_client_factory, the library's own client (its offline check, request ids): "
        "wrapped with the retry budget's hooks, because http_backoff closes the session after a "
        "refused connection and retries on a new one from the factory, whose hooks the public "
        "set_client_factory can give only by knowing how the library makes its client"),
    ("models/hub/calls.py", "huggingface_hub.utils._http._GLOBAL_CLIENT_FACTORY"): (
        "no public getter tells whether the user set a client factory of their own "
        "(set_client_factory): theirs is kept and hooked per try, only the default is wrapped"),
}
"""(path under src/repgeom, private name) -> why it stays. Every entry must still be found."""

ACCESSORS = {"getattr", "setattr", "hasattr", "delattr"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__")) \
        and name != "_"


def _private_module(module: str) -> bool:
    return any(_private(part) for part in module.split("."))


def _imports(tree: ast.Module, package: str) -> dict[str, str]:
    """Local name -> the dotted name it is bound to, for every import of the module."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    root = alias.name.split(".")[0]
                    bound[root] = root
        elif isinstance(node, ast.ImportFrom):
            base = from_module(node, package)
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{base}.{alias.name}"
    return bound


def _dotted(node: ast.expr, bound: dict[str, str]) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    root = bound.get(node.id, node.id)
    return ".".join([root, *reversed(parts)])


@cache
def _resolve(dotted: str) -> object | None:
    """The object a dotted name names (a library's class), or None when it cannot be imported."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr, None)
        return obj
    return None


@cache
def _library_names(cls: type) -> frozenset[str]:
    """The private names a library class and its bases define: attributes of the class, and
    attributes their methods set or read on `self`."""
    names = set()
    for klass in inspect.getmro(cls):
        if klass is object or klass.__module__.split(".")[0] == OURS:
            continue
        names |= {n for n in vars(klass) if _private(n)}
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "self" and _private(node.attr):
                names.add(node.attr)
    return frozenset(names)


class Module:
    """One source file of repgeom: its tree, imports and classes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rel = path.relative_to(PACKAGE).as_posix()
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        self.name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        self.package = self.name if path.name == "__init__.py" else self.name.rpartition(".")[0]
        self.tree = ast.parse(path.read_text())
        self.bound = _imports(self.tree, self.package)
        self.classes = {n.name: n for n in self.tree.body if isinstance(n, ast.ClassDef)}


@cache
def _modules() -> dict[str, Module]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = Module(path)
        found[module.name] = module
    return found


def _external_names(module: Module, cls: ast.ClassDef, seen: frozenset = frozenset()) -> set:
    """The private names `cls` inherits from library classes, through repgeom's own bases."""
    names: set[str] = set()
    for base in cls.bases:
        dotted = _dotted(base, module.bound)
        if dotted is None:
            continue
        if "." not in dotted and dotted in module.classes:  # a class of the same module
            dotted = f"{module.name}.{dotted}"
        if dotted.startswith(OURS + "."):
            owner, _, name = dotted.rpartition(".")
            ours = _modules().get(owner)
            if ours is not None and name in ours.classes and dotted not in seen:
                names |= _external_names(ours, ours.classes[name], seen | {dotted})
            continue
        obj = _resolve(dotted)
        if isinstance(obj, type):
            names |= _library_names(obj)
    return names


def _own_names(modules) -> set[str]:
    """The private names repgeom defines: module and class attributes, functions, classes, and
    attributes its methods set on `self` that no library base class has."""
    own = set()
    for module in modules:
        for cls in (n for n in ast.walk(module.tree) if isinstance(n, ast.ClassDef)):
            inherited = _external_names(module, cls)  # a class nested in a function too
            for node in ast.walk(cls):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    if node is not cls and node.name not in inherited:
                        own.add(node.name)
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                        and isinstance(node.value, ast.Name) \
                        and node.value.id in ("self", "cls") and node.attr not in inherited:
                    own.add(node.attr)
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    own.add(node.target.id)
                elif isinstance(node, ast.Assign):
                    own |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        for node in module.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, ast.Assign):
                own |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                own.add(node.target.id)
    own |= {m.rpartition(".")[2] for m in _modules()}  # our private modules (metrics._spectrum)
    return {n for n in own if _private(n)}


def scan(module: Module, own: set[str]) -> list[tuple[str, int, str]]:
    """(private name, line, what) for every library private name `module` uses."""
    found = []

    def library(dotted: str | None) -> bool:
        return dotted is not None and dotted.split(".")[0] != OURS

    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno, "import") for a in node.names
                      if library(a.name) and _private_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and not node.level and library(node.module):
            for alias in node.names:
                if _private_module(node.module) or _private(alias.name):
                    found.append((f"{node.module}.{alias.name}", node.lineno, "import"))

    def visit(node: ast.AST, inherited: set[str]) -> None:
        if isinstance(node, ast.ClassDef):
            inherited = _external_names(module, node)  # a class nested in a function too
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                        and item.name in inherited:
                    found.append((item.name, item.lineno, "overrides a library method"))
        access = None
        if isinstance(node, ast.Attribute) and _private(node.attr):
            access = (node.value, node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ACCESSORS and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str) and _private(node.args[1].value):
            access = (node.args[0], node.args[1].value)
        elif isinstance(node, ast.Subscript) and _private_string(node.slice) and (
                (isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
                 and node.value.func.id == "vars" and node.value.args)
                or (isinstance(node.value, ast.Attribute) and node.value.attr == "__dict__")):
            # vars(obj)["_name"], obj.__dict__["_name"]
            obj = node.value.args[0] if isinstance(node.value, ast.Call) else node.value.value
            access = (obj, node.slice.value)
        elif isinstance(node, ast.Call) and _called(node) == "attrgetter":
            for arg in node.args:  # operator.attrgetter("_name", "a._b"): on an unknown object
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.extend((part, node.lineno, "not a name repgeom defines")
                              for part in arg.value.split(".") if _private(part)
                              and part not in own)
        elif isinstance(node, ast.Call) and _called(node) == "import_module" and node.args \
                and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and library(node.args[0].value) \
                and _private_module(node.args[0].value):
            found.append((node.args[0].value, node.lineno, "import"))
        if access is not None:
            obj, name = access
            on_self = (isinstance(obj, ast.Name) and obj.id in ("self", "cls")) or (
                isinstance(obj, ast.Call) and isinstance(obj.func, ast.Name)
                and obj.func.id == "super")
            dotted = _dotted(obj, module.bound) if isinstance(obj, ast.Name) else None
            bound_to_import = isinstance(obj, ast.Name) and obj.id in module.bound
            if on_self:
                if name in inherited:
                    found.append((name, node.lineno, "a library base class's"))
            elif bound_to_import and library(dotted):
                found.append((f"{dotted}.{name}", node.lineno, "a library's module or object"))
            elif not (bound_to_import and not library(dotted)) and name not in own:
                found.append((name, node.lineno, "not a name repgeom defines"))
        for child in ast.iter_child_nodes(node):
            visit(child, inherited)

    visit(module.tree, set())
    return found


def _private_string(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and _private(node.value)


def _called(call: ast.Call) -> str | None:
    """The called function's own name: ``f(...)`` and ``module.f(...)`` -> ``f``."""
    func = call.func
    return func.id if isinstance(func, ast.Name) else \
        func.attr if isinstance(func, ast.Attribute) else None


@cache
def _found() -> dict[tuple[str, str], list[int]]:
    own = _own_names(_modules().values())
    found: dict[tuple[str, str], list[int]] = {}
    for module in _modules().values():
        for name, line, _ in scan(module, own):
            found.setdefault((module.rel, name), []).append(line)
    return found


def test_no_unlisted_private_name_of_a_library() -> None:
    unlisted = sorted(f"src/repgeom/{path}:{lines[0]}: {name}"
                      for (path, name), lines in _found().items()
                      if (path, name) not in EXCEPTIONS)
    assert unlisted == [], (
        f"{len(unlisted)} private names of libraries: use the library's public API, or list "
        "the name with its reason in EXCEPTIONS of tests/test_private_names.py")


def test_every_exception_is_still_used() -> None:
    stale = sorted(f"{path}: {name}" for path, name in EXCEPTIONS if (path, name) not in _found())
    assert stale == [], "no longer used: remove from EXCEPTIONS"


def test_the_scan_sees_planted_private_names(tmp_path) -> None:
    """The checker itself: each kind of private use in a planted module is found, and the
    module's own private names are not."""
    path = PACKAGE / "planted_private_names.py"  # parsed only: never written
    module = Module.__new__(Module)
    module.path, module.rel, module.name, module.package = path, "x.py", "repgeom.x", "repgeom"
    module.tree = ast.parse(textwrap.dedent('''
        import importlib
        import operator
        import torch._dynamo
        from lightning.pytorch.callbacks import ThroughputMonitor
        from lightning.pytorch.callbacks.throughput_monitor import _plugin_to_compute_dtype
        from huggingface_hub.utils._http import parse_ratelimit_headers
        from repgeom.metrics._validation import check_int
        from repgeom.metrics import alignment

        class Monitor(ThroughputMonitor):
            def __init__(self):
                self._mine = 0

            def _update(self, trainer, pl_module, batch, iter_num):
                super()._update(trainer, pl_module, batch, iter_num)
                self._throughputs[0]._flops
                self._mine += 1
                return trainer._logger_connector.should_update_logs

        def build():
            class Nested(ThroughputMonitor):
                def _compute(self, trainer):
                    return self._lengths

            return Nested

        def g(trainer, module):
            vars(trainer)["_accelerator_connector"]
            module.__dict__["_modules"]
            operator.attrgetter("_checkpoint_connector", "fit_loop._data_source")(trainer)
            importlib.import_module("torch._inductor")
            importlib.import_module("repgeom.metrics._validation")

        def f(logger, x):
            getattr(logger, "_wandb_init", None)
            torch._C
            alignment._knn_overlap(x)
            return x._version
    '''))
    module.bound = _imports(module.tree, module.package)
    module.classes = {n.name: n for n in module.tree.body if isinstance(n, ast.ClassDef)}
    own = _own_names([*_modules().values(), module])
    found = Counter(name for name, _, _ in scan(module, own))
    assert set(found) == {
        "torch._dynamo", "lightning.pytorch.callbacks.throughput_monitor._plugin_to_compute_dtype",
        "huggingface_hub.utils._http.parse_ratelimit_headers", "_update", "_throughputs",
        "_flops", "_logger_connector", "_wandb_init", "torch._C", "_version",
        # review of issue 47: a class nested in a function, vars/__dict__/attrgetter strings,
        # import_module of a library's private module
        "_compute", "_lengths", "_accelerator_connector", "_modules", "_checkpoint_connector",
        "_data_source", "torch._inductor",
    }
    assert found["_update"] == 2  # the override and the super() call
