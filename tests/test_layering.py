"""The dependency direction of the packages: core ← training, core ← service, never training ↔ service;
the core imports neither torch nor onnxruntime (``retention_torch`` and ``retention_ort`` hold them);
inside ``training/``, rooms (one part of the pipeline each) import down a DAG with the retention engine at
the bottom, and nothing outside a room imports its private names.

Read from the source (every ``import`` statement, lazy ones inside functions and ``TYPE_CHECKING``
blocks included), so a cycle hidden behind a function-level import fails here too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORE = "retention_core"

# package → top-level packages it must never import
FORBIDDEN = {
    CORE: {
        "training",
        "service",
        "benchmarks",
        "clients",
        "tests",
        "torch",
        "transformers",
        "onnxruntime",
        "retention_torch",
        "retention_ort",
        "retention_tasks",  # read by name from the one list of tasks (retention_core.tasks.task_packages)
    },
    "service": {
        "training",
        "benchmarks",
        "tests",
        "torch",
        "transformers",
        "retention_torch",
        "retention_tasks",
    },
    "training": {"service", "benchmarks", "tests", "retention_tasks"},
    # the GPU-shaped forward: torch and the core only (the service's torch backend and the export use it)
    "retention_torch": {
        "training",
        "service",
        "benchmarks",
        "clients",
        "tests",
        "transformers",
        "onnxruntime",
    },
}
# onnxruntime sessions opened one way (the service's ONNX Runtime backend, the export, evaluation,
# benchmarks): onnxruntime alone, nothing of the project (not even the core)
FORBIDDEN["retention_ort"] = FORBIDDEN[CORE] - {"onnxruntime", "retention_ort"} | {CORE}
# The one service module allowed torch: the torch backend, imported only when RETENTION_BACKEND=torch.
TORCH_BACKEND = REPO / "service" / "backends" / "torch_backend.py"


# CPython 3.11.7's AST converter keeps its recursion depth in interpreter-wide state (gh-106905): while
# another thread of this test process (a server an earlier test left running) converts a tree too, a
# parse can fail with "SystemError: AST constructor recursion depth mismatch". The source is fine then.
PARSE_ATTEMPTS = 3


def parse(path: Path) -> ast.Module:
    source = path.read_text(encoding="utf-8")
    for _ in range(PARSE_ATTEMPTS - 1):
        try:
            return ast.parse(source, filename=str(path))
        except SystemError:
            continue
    return ast.parse(source, filename=str(path))


def imported_packages(path: Path) -> set[str]:
    """Top-level names of every module ``path`` imports (absolute imports; the project uses no others)."""
    names: set[str] = set()
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__" and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                names.add(first.value.split(".")[0])
    return names


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """module → the package's modules it imports, for every module file directly in ``root``."""
    modules = {f"{package}.{path.stem}": path for path in sorted(root.glob("*.py"))}
    # ``from package import x`` names x as ``package.x``: kept when x is one of the modules
    return {name: imported_modules(path) & set(modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` (its modules in order, the first repeated at the end), or []."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str]:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return []
        for imported in sorted(graph[module]):
            cycle = visit(imported, [*path, module])
            if cycle:
                return cycle
        done.add(module)
        return []

    for module in sorted(graph):
        cycle = visit(module, [])
        if cycle:
            return cycle
    return []


def violations(package: str) -> list[str]:
    found = []
    for path in sorted((REPO / package).rglob("*.py")):
        bad = imported_packages(path) & FORBIDDEN[package]
        if path == TORCH_BACKEND:
            bad -= {"torch", "retention_torch"}
        if bad:
            found.append(f"{path.relative_to(REPO)} imports {sorted(bad)}")
    return found


def imported_modules(path: Path) -> set[str]:
    """Full dotted names of every module ``path`` imports (``from a import b`` counts as ``a`` and
    ``a.b``: b may be a module)."""
    names: set[str] = set()
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def reaching(paths: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    """``path imports module`` for every import of a forbidden module (or one inside it)."""
    found = []
    for path in paths:
        for module in sorted(imported_modules(path)):
            if any(module == bad or module.startswith(bad + ".") for bad in forbidden):
                found.append(f"{path.relative_to(REPO)} imports {module}")
    return found


def test_core_imports_neither_training_nor_service() -> None:
    assert violations(CORE) == []


def test_no_core_module_opens_onnxruntime_sessions() -> None:
    """Sessions are opened by ``retention_ort``, outside the core: no core module reaches it."""
    modules = sorted((REPO / CORE).rglob("*.py"))
    assert modules and reaching(modules, ("retention_ort", "onnxruntime")) == []


def test_the_session_package_imports_nothing_of_the_project() -> None:
    assert violations("retention_ort") == []


def test_service_never_imports_training() -> None:
    assert violations("service") == []


def test_training_never_imports_service() -> None:
    assert violations("training") == []


def test_the_torch_forward_imports_torch_and_the_core_only() -> None:
    assert violations("retention_torch") == []


def test_torch_is_imported_only_by_the_torch_backend_and_that_only_when_chosen() -> None:
    """One service module imports torch (the torch backend); ``service.backends`` imports it only inside
    ``open_backend``'s torch branch, so a server on onnxruntime never loads it."""
    importers = [
        path.relative_to(REPO)
        for path in sorted((REPO / "service").rglob("*.py"))
        if imported_packages(path) & {"torch", "retention_torch"}
    ]
    assert importers == [TORCH_BACKEND.relative_to(REPO)]
    backends = parse(REPO / "service" / "backends" / "__init__.py")
    top_level = {node.module for node in backends.body if isinstance(node, ast.ImportFrom) and node.module}
    assert "service.backends.torch_backend" not in top_level


# The batch client talks HTTP; its Ray engine runs the service's app in-process (the 'ray' extra).
CLIENTS_FORBIDDEN = FORBIDDEN["service"] | {"onnxruntime"}  # what the service may not import, and a session
RAY_ENGINE = REPO / "clients" / "ray_batch.py"


def test_clients_talk_http_but_the_ray_engine() -> None:
    """``clients/`` imports neither training nor torch nor onnxruntime; ``service`` only in the Ray engine
    (``clients/ray_batch.py``), which ``clients.batch`` imports only inside its ``--engine ray`` branch."""
    paths = sorted((REPO / "clients").rglob("*.py"))
    assert [path for path in paths if imported_packages(path) & CLIENTS_FORBIDDEN] == []
    assert [path for path in paths if "service" in imported_packages(path)] == [RAY_ENGINE]
    batch = parse(REPO / "clients" / "batch.py")
    top_level = {node.module for node in batch.body if isinstance(node, ast.ImportFrom) and node.module}
    assert "clients.ray_batch" not in top_level and "clients.ray_batch" in imported_modules(
        REPO / "clients" / "batch.py"
    )


def test_the_scanner_sees_lazy_imports(tmp_path: Path) -> None:
    """The check itself: a function-level import and ``__import__`` are both found."""
    source = tmp_path / "module.py"
    source.write_text(
        "def f():\n    from service.server import ModelServer\n    return __import__('training.fit')\n"
    )
    assert imported_packages(source) == {"service", "training"}


# The rooms of ``training/``, each named for its part of the pipeline, and the rooms each may import: a DAG
# with the retention engine at the bottom. A room is a subpackage (``training/<room>/``) or, at the top, one
# module (the CLI, the tiny models); ``training/__init__.py`` imports nothing.
TRAINING_ROOMS: dict[str, set[str]] = {
    "engine": set(),  # the retention math, the model and its heads, probe and baselines, the backbones
    "recipes": {"engine"},  # the recipe schema and the datasets a recipe names
    "tasks": {"engine", "recipes"},  # the task plug-in types and registry, batches, codecs, the teacher
    "evaluation": {"engine", "recipes", "tasks"},  # running predictions, the codec loop, reporting
    "fitting": {"engine", "recipes", "tasks"},  # the objective, the training loop and runs, retrofits
    "export": {"engine", "recipes"},  # graph + parity, two-path, int8, torch weights, manifest, install
    "tiny": {"engine", "recipes", "tasks", "export"},  # tiny random models (tests, quick benchmarks)
    "__main__": {"engine", "recipes", "tasks", "evaluation", "fitting", "export"},  # the CLI
}


def room_of(module: str) -> str | None:
    """The room of a module of ``training`` (``training.<room>[.…]``); None for the package itself and for
    modules of other packages."""
    parts = module.split(".")
    return parts[1] if parts[0] == "training" and len(parts) > 1 else None


def room_graph() -> dict[str, set[str]]:
    """room → the other rooms its modules import (lazy and ``TYPE_CHECKING`` imports included)."""
    graph: dict[str, set[str]] = {}
    for module, imported in package_graph(REPO / "training", "training").items():
        room = room_of(module)
        if room is None:  # training/__init__.py
            assert imported == set(), imported
            continue
        others = {room_of(name) for name in imported} - {None, room}
        graph.setdefault(room, set()).update(other for other in others if other is not None)
    return graph


def test_training_is_rooms_importing_down_the_pipeline() -> None:
    """Every module of ``training/`` lives in a declared room and imports only the rooms below its own:
    the engine imports no other room; recipes, tasks, evaluation, fitting and export build on it; the CLI
    sits on top. A room importing up (the engine reading a recipe, export reading the fitting loop) fails
    here, lazy imports included."""
    graph = room_graph()
    assert set(graph) == set(TRAINING_ROOMS)
    upward = {room: sorted(imported - TRAINING_ROOMS[room]) for room, imported in graph.items()}
    assert {room: rooms for room, rooms in upward.items() if rooms} == {}
    assert find_cycle(TRAINING_ROOMS) == []  # the allowed directions are a DAG
    assert graph["engine"] == set() and graph["__main__"]  # the scanner read the rooms


def test_the_retention_math_imports_no_other_training_module() -> None:
    """The bottom of the engine: ``training/engine/selection.py`` (the inference path) imports nothing of
    the package, ``training/engine/terms.py`` (the training terms) only the selection."""
    graph = package_graph(REPO / "training", "training")
    assert graph["training.engine.selection"] == set()
    assert graph["training.engine.terms"] == {"training.engine.selection"}


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def dotted(node: ast.expr) -> str | None:
    """``a.b.c`` of a Name / Attribute chain; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def private_imports(path: Path, room: str | None) -> list[str]:
    """``path imports module._name`` for every private name of a ``training`` module that ``path``, in
    ``room`` (None: outside ``training/``), takes from another room: ``from training.x.y import _name``,
    or ``alias._name`` where ``alias`` names a module of training (``from training.x import y as alias``,
    ``import training.x.y``)."""
    tree = parse(path)
    name = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    found: list[str] = []
    aliases: dict[str, str] = {}  # local name → what it names in training
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and room_of(node.module or ""):
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                if is_private(alias.name) and room_of(target) != room:
                    found.append(f"{name} imports {target}")
                aliases[alias.asname or alias.name] = target
        elif isinstance(node, ast.Import):
            aliases.update({alias.asname: alias.name for alias in node.names if alias.asname})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            base = dotted(node.value) or ""
            target = f"{aliases.get(base, base)}.{node.attr}"
            if room_of(target) is not None and room_of(target) != room:
                found.append(f"{name} imports {target}")
    return sorted(set(found))


# Every package that may import training: none takes a private name out of a room.
TRAINING_IMPORTERS = ("training", "benchmarks", "experiments", "tests", "retention_tasks", "scripts")


def test_nothing_outside_a_room_imports_its_private_names() -> None:
    """A room's private (``_name``) names are its own; the other rooms, benchmarks, experiments, tests and
    the task packages import its public names."""
    found = []
    for package in TRAINING_IMPORTERS:
        for path in sorted((REPO / package).rglob("*.py")):
            module = ".".join(path.relative_to(REPO).with_suffix("").parts)
            found += private_imports(path, room_of(module))
    assert found == []


def test_the_private_name_check_sees_each_form(tmp_path: Path) -> None:
    """The check itself: a private name imported by name or read off a module alias (also lazily) from
    outside its room; inside the room it is allowed."""
    source = tmp_path / "study.py"
    source.write_text(
        "import training.export.two_path\n"
        "from training.export.two_path import _branch\n"
        "from training.engine import model as M\n"
        "def f():\n"
        "    from training.engine.model import RetentionModel\n"
        "    return M._scatter_valid, training.export.two_path._initializer_key, RetentionModel\n"
    )
    assert private_imports(source, None) == [
        f"{source} imports training.engine.model._scatter_valid",
        f"{source} imports training.export.two_path._branch",
        f"{source} imports training.export.two_path._initializer_key",
    ]
    assert private_imports(source, "export") == [f"{source} imports training.engine.model._scatter_valid"]


def test_the_cycle_finder_sees_a_cycle_behind_lazy_imports(tmp_path: Path) -> None:
    """The check itself: a → b at module level, b → a inside a function and a TYPE_CHECKING block."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text("from pkg.b import thing\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.c\n"
        "def thing():\n    from pkg import a\n    return a\n"
    )
    (package / "c.py").write_text("")
    graph = import_graph(package, "pkg")
    assert graph == {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a", "pkg.c"}, "pkg.c": set()}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]
    assert find_cycle({"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": set()}) == []


# Every package's own modules, subpackages included, import one another without a cycle.
PACKAGES = (
    "training",
    "service",
    "retention_core",
    "retention_tasks",
    "retention_torch",
    "clients",
    "benchmarks",
    "experiments",
)


def package_graph(root: Path, package: str) -> dict[str, set[str]]:
    """module → the package's modules it imports, for every module under ``root`` (subpackages included;
    ``a/__init__.py`` is the module ``package.a``)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        modules[".".join((package, *parts[: -1 if parts[-1] == "__init__" else None]))] = path
    return {name: (imported_modules(path) & set(modules)) - {name} for name, path in modules.items()}


def test_no_package_has_an_import_cycle() -> None:
    """In every package, lazy imports included: what two modules both need lives in a third that imports
    neither (``clients.records`` under the HTTP and the Ray batch engines, ``benchmarks.retrieval_parts``
    under the retrieval grid and the long-document study)."""
    cycles: dict[str, list[str]] = {}
    for package in PACKAGES:
        graph = package_graph(REPO / package, package)
        assert len(graph) > 1, package  # the scanner read the package
        cycles[package] = find_cycle(graph)
    assert {package: cycle for package, cycle in cycles.items() if cycle} == {}


def test_the_package_scan_sees_a_cycle_through_a_subpackage(tmp_path: Path) -> None:
    """The check itself: a module of a subpackage importing back, lazily, the module that imports it."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.sub.b import thing\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("def thing():\n    import pkg.a\n    return pkg.a\n")
    graph = package_graph(package, "pkg")
    assert graph == {"pkg": set(), "pkg.a": {"pkg.sub.b"}, "pkg.sub": set(), "pkg.sub.b": {"pkg.a"}}
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.a"]
    (package / "sub" / "b.py").write_text("def thing():\n    return 1\n")
    assert find_cycle(package_graph(package, "pkg")) == []


# Import every core module in a fresh interpreter where torch, transformers and onnxruntime cannot be
# imported.
NO_TORCH = """
import importlib, pkgutil, sys

ABSENT = ("torch", "transformers", "onnxruntime", "retention_ort", "training", "service")

class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ABSENT:
            raise ImportError(f"{name} is absent in this check")
        return None

sys.meta_path.insert(0, Absent())
import retention_core
for info in pkgutil.walk_packages(retention_core.__path__, "retention_core."):
    importlib.import_module(info.name)
print("imported", sorted(m for m in sys.modules if m.startswith("retention_core")))
"""


def test_core_imports_with_torch_absent() -> None:
    result = subprocess.run(
        [sys.executable, "-c", NO_TORCH], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "retention_core.tasks" in result.stdout and "retention_core.contract" in result.stdout


# Inside the service. The HTTP layer is written against ``service.serving`` (a served model without its
# session, the server protocol): it never sees onnxruntime. Only its composition root builds the server.
SERVING_VIEW = [
    *sorted((REPO / "service" / "api").rglob("*.py")),
    REPO / "service" / "serving.py",
]
COMPOSITION_ROOT = REPO / "service" / "api" / "app.py"
HOLDS_A_SESSION = (
    "onnxruntime",
    "retention_ort",
    "torch",
    "retention_torch",
    "service.backends",
    "service.runtime",
    "service.repository",
    "service.server",
    "service.scheduling.batcher",
    "service.scheduling.execution",
    "service.scheduling.learning",
)
# The scheduler serves one model; it never reaches up into the server that owns it or the HTTP layer.
SCHEDULING = sorted((REPO / "service" / "scheduling").rglob("*.py"))
ABOVE_SCHEDULING = ("service.api", "service.server", "service.repository", "fastapi", "starlette")


def test_the_http_layer_never_sees_onnxruntime() -> None:
    paths = [path for path in SERVING_VIEW if path != COMPOSITION_ROOT]
    assert len(paths) > 5 and reaching(paths, HOLDS_A_SESSION) == []


# A request's budget is a pure decision the HTTP layer calls: no FastAPI in it (a unit test reads it).
BUDGET = REPO / "service" / "api" / "budget.py"


def test_the_budget_is_decided_without_fastapi() -> None:
    assert imported_packages(BUDGET) & {"fastapi", "starlette"} == set()
    assert service_imports_outside([BUDGET], ("service.serving", "service.settings")) == []


# The HTTP layer's whole view of the service: ``service.serving`` (the server protocol, what it takes and
# returns) and the shared modules below; never the scheduler (it returns facts, the HTTP layer writes
# the headers). Its composition root builds the server besides.
HTTP_SEES = (
    "service.api",
    "service.serving",
    "service.errors",
    "service.settings",
    "service.metrics",
    "service.rates",
)
ROOT_BUILDS = ("service.server",)


def service_imports_outside(paths: list[Path], allowed: tuple[str, ...]) -> list[str]:
    """``path imports module`` for every ``service.*`` module imported that ``allowed`` does not cover."""
    found = []
    for path in paths:
        name = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        for module in sorted(imported_modules(path)):
            if module.split(".")[0] != "service" or module == "service":
                continue
            if not any(module == ok or module.startswith(ok + ".") for ok in allowed):
                found.append(f"{name} imports {module}")
    return found


def test_the_http_layer_sees_the_server_through_serving_alone() -> None:
    """``service/api/**`` imports ``service.serving`` and the shared modules, never ``service.scheduling``;
    ``service.serving`` itself imports no other service module (lazy imports included)."""
    api = [path for path in SERVING_VIEW if path.is_relative_to(REPO / "service" / "api")]
    paths = [path for path in api if path != COMPOSITION_ROOT]
    assert len(paths) > 5 and reaching(api, ("service.scheduling",)) == []
    assert service_imports_outside(paths, HTTP_SEES) == []
    assert service_imports_outside([COMPOSITION_ROOT], (*HTTP_SEES, *ROOT_BUILDS)) == []
    assert service_imports_outside([REPO / "service" / "serving.py"], ()) == []


def test_the_boundary_check_sees_a_lazy_scheduler_import(tmp_path: Path) -> None:
    """The check itself: a function-level import of the scheduler is found."""
    source = tmp_path / "handler.py"
    source.write_text("def f():\n    from service.scheduling.jobs import Job\n    return Job\n")
    found = service_imports_outside([source], HTTP_SEES)
    assert found and all("service.scheduling.jobs" in line for line in found)


def test_scheduling_never_imports_the_layers_above_it() -> None:
    assert SCHEDULING and reaching(SCHEDULING, ABOVE_SCHEDULING) == []


# The same, transitively: every HTTP module but the composition root imports where onnxruntime cannot.
NO_ORT = """
import importlib, pathlib, sys

class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "onnxruntime":
            raise ImportError(f"{name} is absent in this check")
        return None

sys.meta_path.insert(0, Absent())
import service.serving
for path in sorted(pathlib.Path("service/api").rglob("*.py")):
    module = ".".join(path.with_suffix("").parts).removesuffix(".__init__")
    if module != "service.api.app":
        importlib.import_module(module)
print("imported", sorted(m for m in sys.modules if m.startswith("service.")))
"""


def test_the_http_layer_imports_without_onnxruntime() -> None:
    result = subprocess.run(
        [sys.executable, "-c", NO_ORT], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "service.api.routers.tasks" in result.stdout and "service.runtime" not in result.stdout


# The whole server on onnxruntime imports where torch cannot be imported (the CPU serving image), and
# asking it for the torch backend there is a clear load error, not an ImportError.
NO_TORCH_SERVER = """
import importlib, sys
from pathlib import Path

class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "training", "retention_torch"):
            raise ImportError(f"{name} is absent in this check")
        return None

sys.meta_path.insert(0, Absent())
for module in ("service.api.app", "service.server", "service.runtime", "service.backends.onnx_backend"):
    importlib.import_module(module)
from service.backends import ModelLoadError, open_backend
from service.settings import Settings
try:
    open_backend(Path("models/some-model"), None, None, Settings(backend="torch"))
except ModelLoadError as exc:
    print("refused:", exc)
print("torch loaded:", any(m == "torch" or m.startswith("torch.") for m in sys.modules))
"""


def test_the_onnxruntime_server_imports_without_torch() -> None:
    result = subprocess.run(
        [sys.executable, "-c", NO_TORCH_SERVER], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "refused: some-model: RETENTION_BACKEND=torch needs torch" in result.stdout
    assert "torch loaded: False" in result.stdout


# The modules every layer shares (metrics, errors, settings, serving, rates) sit below all of them: none
# imports the scheduler, the server, the loader, the backends or the HTTP layer (no arrow runs back up).
SHARED_MODULES = ("metrics.py", "errors.py", "settings.py", "serving.py", "rates.py")
SHARED = [REPO / "service" / name for name in SHARED_MODULES]
ABOVE_SHARED = (
    "service.scheduling",
    "service.server",
    "service.repository",
    "service.runtime",
    "service.backends",
    "service.api",
)


def test_the_shared_service_modules_import_nothing_above_them() -> None:
    assert reaching(SHARED, ABOVE_SHARED) == []


# A task is one package (retention_tasks/<name>/, a test's tests/task_packages/<name>/) of three parts, each
# held to its side: ``spec.py`` to the core alone, ``training.py`` never to the service, ``face.py`` never to
# training. A part never imports another task part of the other side either (a spec no ``.training``).
TASK_PACKAGE_ROOTS = (REPO / "retention_tasks", REPO / "tests" / "task_packages")
PART_FORBIDS = {
    "spec": FORBIDDEN[CORE] - {"tests", "retention_tasks"} | {"fastapi", "starlette"},
    "training": {"service", "benchmarks", "clients", "fastapi", "starlette"},
    "face": {"training", "benchmarks", "torch", "transformers", "retention_torch"},
}
PART_FORBIDS["codec"] = PART_FORBIDS["spec"]  # the request ↔ graph-row codec: core side, as its spec
PART_FORBIDS["learn"] = PART_FORBIDS["training"]  # the task's training math: torch side, as its entry
PART_NEVER_IMPORTS = {
    "spec": ("training", "face", "learn"),
    "codec": ("training", "face", "learn"),
    "training": ("face",),
    "learn": ("face",),
    "face": ("training", "learn"),
}
# Files of each part at least: the four shipped tasks and the tests' toys (a toy may keep its codec in its
# spec)
PART_MINIMUM = {"spec": 6, "training": 6, "face": 6, "codec": 4, "learn": 4}


def task_parts(part: str) -> list[Path]:
    return sorted(path for root in TASK_PACKAGE_ROOTS for path in root.glob(f"*/{part}.py"))


def part_violations(paths: list[Path], part: str) -> list[str]:
    """``path imports x`` for every forbidden package or other-side task part a ``part`` file imports."""
    found = []
    for path in paths:
        name = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        bad = imported_packages(path) & PART_FORBIDS[part]
        sides = {
            m for m in imported_modules(path) if "." in m and m.rsplit(".", 1)[1] in PART_NEVER_IMPORTS[part]
        }
        found += [f"{name} imports {module}" for module in sorted(bad | sides)]
    return found


def test_each_part_of_a_task_package_keeps_to_its_side() -> None:
    for part in PART_FORBIDS:
        paths = task_parts(part)
        assert len(paths) >= PART_MINIMUM[part], part
        assert part_violations(paths, part) == [], part


def test_the_part_check_sees_a_face_importing_training(tmp_path: Path) -> None:
    """The check itself: a face importing the training side (lazily), a spec importing a face."""
    face = tmp_path / "face.py"
    face.write_text(
        "def f():\n    from training.tasks.registry import TrainingTask\n    return TrainingTask\n"
    )
    spec = tmp_path / "spec.py"
    spec.write_text("from retention_tasks.qa.face import FACE\n")
    assert part_violations([face], "face") == [f"{face} imports training"]
    assert part_violations([spec], "spec") == [f"{spec} imports retention_tasks.qa.face"]


# Every shipped task's spec imports where torch, training and the service cannot be imported (the core's
# registry filled from the list, as a torch-free tool sees it); then, the service importable again, every
# face too (as the serving image, which has no torch and no training, sees them).
NO_TORCH_SPECS = """
import sys

ABSENT = {"torch", "transformers", "training", "service", "fastapi"}

class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ABSENT:
            raise ImportError(f"{name} is absent in this check")
        return None

sys.meta_path.insert(0, Absent())
from retention_core.tasks import TASKS
print(sorted(TASKS))
ABSENT -= {"service", "fastapi"}
from service.api.faces import FACES
print(sorted(FACES))
"""


def test_the_registries_fill_with_torch_and_training_absent() -> None:
    result = subprocess.run(
        [sys.executable, "-c", NO_TORCH_SPECS], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    shipped = "['classification', 'embedding', 'qa', 'summarization']"
    assert result.stdout.split("\n")[:2] == [shipped, shipped]
