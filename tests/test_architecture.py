"""The package's import graph, computed from the source (no import is executed), and the rules it must keep:
no import cycle, the decoding core imports no drafter implementation or method record, and ``pacer/methods``
holds registry records only.

The graph: an edge ``a -> b`` for every ``import b`` / ``from b import x`` inside ``pacer`` found anywhere in
module ``a``, relative imports resolved: function bodies included (a deferred import is still a dependency) and
imports under ``if TYPE_CHECKING:`` too (a type ``a`` names is a dependency of its reader, and a circle hidden
there comes back as soon as the type is needed at run time). ``from p import x`` is an edge to ``p.x`` where
``p.x`` is a module, else to ``p``. Importing ``a.b.c`` also runs the ``__init__`` of packages ``a`` and ``a.b``:
an edge to each, except to a package that already contains the importing module (it is being imported already)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "pacer"

def modules(src: Path = SRC) -> dict[str, Path]:
    """Module name -> file, for every module of the package (a package is its ``__init__``)."""
    out = {}
    for path in sorted((src / ROOT).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(tree: ast.AST):
    """Every ``Import`` / ``ImportFrom`` node at any depth (function bodies, ``if TYPE_CHECKING:`` blocks)."""
    return (node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)))


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the package modules it imports (see the module docstring for what counts)."""
    mods = modules(src)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_package = path.name == "__init__.py"
        own = {".".join(mod.split(".")[:i]) for i in range(1, mod.count(".") + 2)}  # mod and its packages
        if not is_package:
            own.discard(mod)
        targets: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found = [(a.name, False) for a in node.names]
            else:
                base = _resolve(mod, is_package, node)
                found = []
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    # ``from p import x``: the module ``p.x`` if there is one, else a name ``p`` defines
                    found.append((sub, False) if sub in mods else (base, True))
            for name, needs_body in found:
                parts = name.split(".")
                for i in range(1, len(parts) + 1):
                    target = ".".join(parts[:i])
                    if target not in mods:
                        continue
                    # a package containing this module is being imported already, unless a name is taken from
                    # its ``__init__`` (that must have run that far)
                    if target in own and not (needs_body and i == len(parts)):
                        continue
                    targets.add(target)
        targets.discard(mod)
        graph[mod] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[frozenset[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = set()
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.add(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.append(frozenset(comp))
    return out


def cycle_path(graph: dict[str, set[str]], comp: frozenset[str]) -> list[str]:
    """One import cycle through the component's first module: ``[a, b, ..., a]`` (shortest, by BFS)."""
    start = min(comp)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node] & comp):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [*reversed(path), start]
                if child not in prev:
                    prev[child] = node
                    nxt.append(child)
        frontier = nxt
    return sorted(comp)


def describe(graph: dict[str, set[str]], comps: list[frozenset[str]]) -> str:
    return "\n".join(f"cycle among {sorted(c)}: {' -> '.join(cycle_path(graph, c))}" for c in comps)


def test_graph_sees_the_package():
    graph = import_graph()
    assert {"pacer", "pacer.decoding", "pacer.decoding.loop", "pacer.methods.registry"} <= set(graph)
    assert "pacer.decoding.loop" in graph["pacer.decoding"]  # the package's __init__ imports its loop
    assert "pacer.methods" in graph["pacer"]


def test_graph_rules(tmp_path):
    """The graph builder on a made-up package: relative imports, deferred imports, TYPE_CHECKING, packages."""
    pkg = tmp_path / ROOT
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import b\n"
                              "def f():\n    from .sub.c import x\n")
    (pkg / "b.py").write_text("import pacer.sub.d\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from .. import b\nfrom . import d\nfrom .d import y\n")
    (pkg / "sub" / "d.py").write_text("from . import name_in_init\n")
    graph = import_graph(tmp_path)
    assert graph["pacer"] == {"pacer.a"}
    assert graph["pacer.a"] == {"pacer.b", "pacer.sub", "pacer.sub.c"}  # b under TYPE_CHECKING counts too
    assert graph["pacer.b"] == {"pacer.sub", "pacer.sub.d"}  # importing a module runs its package's __init__
    assert graph["pacer.sub.c"] == {"pacer.b", "pacer.sub.d"}
    assert graph["pacer.sub.d"] == {"pacer.sub"}  # a name from the package's own __init__
    assert cycles(graph) == []
    (pkg / "b.py").write_text("import pacer.sub.c\n")
    graph = import_graph(tmp_path)
    assert cycles(graph) == [frozenset({"pacer.b", "pacer.sub.c"})]
    assert cycle_path(graph, cycles(graph)[0]) == ["pacer.b", "pacer.sub.c", "pacer.b"]


def test_no_import_cycle():
    """No import circle, type-only and deferred imports included: each module can be read (and loaded) after the
    modules it imports, and a module's tests need nothing above it."""
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles:\n" + describe(graph, found)


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for child in graph[todo.pop()] - seen:
            seen.add(child)
            todo.append(child)
    return seen


@pytest.mark.parametrize("banned", ["pacer.drafters", "pacer.methods"])
def test_decoding_imports_no_implementation(banned):
    """The decoding core (loop and the drafter interface) imports no drafter implementation and no method
    record, directly or through another module."""
    graph = import_graph()
    core = [m for m in graph if m == "pacer.decoding" or m.startswith("pacer.decoding.")]
    bad = {m: found for m in core
           if (found := sorted(t for t in _reach(graph, m) if t == banned or t.startswith(banned + ".")))}
    assert not bad, f"pacer.decoding reaches {banned} (module: what it reaches): {bad}"


#: the classes ``pacer/methods`` may define: the registry's own records
REGISTRY_TYPES = {"registry": {"Method", "Option", "Build"}}


def test_methods_hold_records_only():
    """``pacer/methods/*.py`` define no class but the registry's records: drafters and policies live in
    ``pacer.drafters`` and ``pacer.policies``."""
    found = {}
    for path in sorted((SRC / ROOT / "methods").glob("*.py")):
        classes = {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)}
        extra = classes - REGISTRY_TYPES.get(path.stem, set())
        if extra:
            found[path.name] = sorted(extra)
    assert not found, f"classes outside the registry's records in pacer/methods: {found}"


# ------------------------------------------------------------------------------------------- private names
SCRIPTS = SRC.parent / "scripts"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(src: Path = SRC, scripts: Path = SCRIPTS) -> list[str]:
    """``module:line name`` of every private name (one leading underscore) that a module of the package or a script
    takes from another module of the package: ``from m import _x``, or ``m._x`` on a module ``m`` it imported."""
    mods = modules(src)
    files = {**mods, **{f"scripts.{p.stem}": p for p in sorted(scripts.glob("*.py"))}}
    found = []
    for mod, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        bound: dict[str, str] = {}  # a local name -> the package module it names
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _resolve(mod, is_package, node)
                if base != ROOT and not base.startswith(ROOT + "."):
                    continue
                for a in node.names:
                    if _private(a.name):
                        found.append(f"{mod}:{node.lineno} {base}.{a.name}")
                    elif f"{base}.{a.name}" in mods:
                        bound[a.asname or a.name] = f"{base}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in mods:  # ``import pacer.x as y`` binds y; ``import pacer.x`` binds pacer
                        bound[a.asname or ROOT] = a.name if a.asname else ROOT
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                    and bound.get(node.value.id, mod) != mod):
                found.append(f"{mod}:{node.lineno} {bound[node.value.id]}.{node.attr}")
    return found


def test_private_imports_on_a_planted_package(tmp_path):
    pkg = tmp_path / ROOT
    (pkg / "sub").mkdir(parents=True)
    (tmp_path / "scripts").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def _key():\n    return 1\n")
    (pkg / "sub" / "__init__.py").write_text("from .. import a\nx = a._key()\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import _key, __doc__\n    return _key\n"
                                      "def _own():\n    return _own\n")
    (pkg / "fine.py").write_text("from .a import _key as key  # noqa\nfrom .sub import b as _b\n"
                                 "import os\nos._exit\nclass C:\n    _x = 1\n    def g(self):\n"
                                 "        return self._x\n")
    (tmp_path / "scripts" / "tool.py").write_text("import pacer.sub.b as b\nb._own()\n")
    assert private_imports(tmp_path, tmp_path / "scripts") == [
        f"{ROOT}.fine:1 {ROOT}.a._key", f"{ROOT}.sub:2 {ROOT}.a._key", f"{ROOT}.sub.b:2 {ROOT}.a._key",
        f"scripts.tool:2 {ROOT}.sub.b._own"]


def test_no_module_imports_a_private_name_of_another():
    """What one module needs of another is public in it (``pacer.machine.machine_key``, ``pacer.timing.timed``),
    never ``from m import _x``: a private name may change without a look at its users."""
    assert private_imports() == [], "make the name public where it belongs, or move the code that needs it"


# ----------------------------------------------------------------------------------- backends and the Decoder
#: the layers above the API: they load a :class:`pacer.Decoder` and drive it (the command line, the server, the
#: benchmark, the collection and training jobs, the vLLM integration); every other module works on
#: a :class:`pacer.pair.Pair` and never refers to the ``Decoder``
ABOVE_API = ("pacer", "pacer.__main__", "pacer.api", "pacer.args", "pacer.cli", "pacer.bench", "pacer.serve",
             "pacer.integrations", "pacer.preverify_cli", "pacer.preverify.collect")
#: where backend names may be compared: the backend records themselves
RECORDS = "pacer.backends"


def _above_api(name: str) -> bool:
    return any(name == a or (a != ROOT and name.startswith(a + ".")) for a in ABOVE_API)


def _backend_names() -> set[str]:
    from pacer import backends

    return set(backends.names())


def _string_constants(node: ast.expr):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for elt in node.elts:
            yield from _string_constants(elt)


def backend_name_tests(src: Path = SRC, names: set[str] | None = None) -> list[str]:
    """``module:line`` of every comparison of a value with a backend's name (``== "llamacpp"``, ``in
    ("transformers", ...)``) outside the backend records."""
    names = _backend_names() if names is None else names
    found = []
    for name, path in modules(src).items():
        if name == RECORDS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare) and any(
                    s in names for op in (node.left, *node.comparators) for s in _string_constants(op)):
                found.append(f"{name}:{node.lineno}")
    return found


def decoder_references(src: Path = SRC) -> list[str]:
    """``module:line`` of every reference to the ``Decoder`` below the API: an import of ``pacer.api`` or of the
    name, a use of the name, or a parameter called ``decoder``/``dec`` (the whole Decoder, duck-typed)."""
    found = []
    for name, path in modules(src).items():
        if _above_api(name):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            bad = (isinstance(node, ast.Name) and node.id == "Decoder") or (
                isinstance(node, ast.Attribute) and node.attr == "Decoder") or (
                isinstance(node, ast.ImportFrom) and (any(a.name == "Decoder" for a in node.names)
                                                     or (node.module or "").endswith("api"))) or (
                isinstance(node, ast.arg) and node.arg in ("decoder", "dec"))
            if bad:
                found.append(f"{name}:{node.lineno}")
    return found


def test_rules_on_a_planted_package(tmp_path):
    pkg = tmp_path / ROOT
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("def f(decoder):\n    return decoder.target\n")
    (pkg / "cmp.py").write_text("def g(b):\n    return b.backend in ('toy', 'x')\n")
    (pkg / "fine.py").write_text("def h(pair, b):\n    return b == 'other' and pair.target\n")
    assert decoder_references(tmp_path) == [f"{ROOT}.low:1"]
    assert backend_name_tests(tmp_path, {"toy"}) == [f"{ROOT}.cmp:2"]


def test_no_backend_name_compared_outside_the_records():
    assert backend_name_tests() == [], "ask the backend's record (pacer.backends) instead of testing its name"


def test_no_module_below_the_api_refers_to_the_decoder():
    assert decoder_references() == [], "modules below the API take a pacer.pair.Pair, not the Decoder"


# --------------------------------------------------------------------------------------------- the backends
BACKENDS_DIR = SRC / ROOT / "backends"


def _subclasses_of(tree: ast.AST, base: str) -> list[str]:
    """Names of the classes in ``tree`` that list ``base`` (``base`` or ``x.base``) among their bases."""
    return [n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and any(
        (isinstance(b, ast.Name) and b.id == base) or (isinstance(b, ast.Attribute) and b.attr == base)
        for b in n.bases)]


def test_one_file_per_built_in_backend():
    """Each built-in backend is one file of ``pacer/backends/`` named after its record, holding the record's
    loader and version, its loaded-model class and its ``ModelBackend``; no other file of pacer defines a
    loaded-model class, and every file there is a backend."""
    import inspect

    from pacer import backends
    from pacer.decoding.backend import ModelBackend
    from pacer.models import LoadedModel

    files = {p.stem for p in BACKENDS_DIR.glob("*.py")} - {"__init__"}
    built_in = {n for n in backends.names() if backends.get(n).load.__module__.startswith(ROOT + ".")}
    assert files == built_in == {"transformers", "llamacpp"}
    for name in sorted(built_in):
        mod = importlib.import_module(f"{ROOT}.backends.{name}")
        record = backends.get(name)
        assert record.load.__module__ == record.version.__module__ == mod.__name__
        own = [c for c in vars(mod).values() if inspect.isclass(c) and c.__module__ == mod.__name__]
        loaded = [c for c in own if issubclass(c, LoadedModel)]
        assert loaded and all(c.backend == name for c in loaded), f"{name}: its loaded-model class"
        assert any(issubclass(c, ModelBackend) for c in own), f"{name}: its ModelBackend"
    elsewhere = {name: found for name, path in modules().items()
                 if not name.startswith(f"{ROOT}.backends.")
                 and (found := _subclasses_of(ast.parse(path.read_text()), "LoadedModel"))}
    assert not elsewhere, f"loaded-model classes outside pacer/backends/: {elsewhere}"


def test_models_is_backend_independent():
    """``pacer.models`` (the loaded-model contract, threads, fingerprints, the tokenizer check) reaches neither the
    backend registry nor any backend's file, directly or through another module (the registry loads models and
    names the contract); and the decoding core reaches neither ``pacer.models`` nor ``pacer.backends``: it works on
    the :class:`~pacer.decoding.backend.ModelBackend` that the contract's ``open`` returns."""
    graph = import_graph()
    bad = sorted(t for t in _reach(graph, f"{ROOT}.models") if t.startswith(f"{ROOT}.backends"))
    assert not bad, f"pacer.models reaches {bad}"
    core = [m for m in graph if m == f"{ROOT}.decoding" or m.startswith(f"{ROOT}.decoding.")]
    bad = sorted({t for m in core for t in _reach(graph, m)
                  if t == f"{ROOT}.models" or t.startswith(f"{ROOT}.backends")})
    assert not bad, f"pacer.decoding reaches {bad}"


# -------------------------------------------------------------------------------------------------- the Decoder
#: the most lines the ``Decoder`` class may take: it holds a pair and a method factory and runs the loop; loading,
#: the prompt's tokens, method building and costs live in ``pacer.pair`` and ``pacer.factory``
DECODER_LINES = 150


def _decoder_class(src: Path = SRC) -> ast.ClassDef:
    tree = ast.parse((src / ROOT / "api.py").read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Decoder")


def _self_attributes_set(cls: ast.ClassDef) -> set[str]:
    out = set()
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        for t in targets:
            for e in ast.walk(t):
                if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
                    out.add(e.attr)
    return out


def test_the_decoder_is_small_and_copies_nothing():
    """``Decoder`` is at most :data:`DECODER_LINES` lines and keeps two things, its ``pair`` and its ``methods``
    (the :class:`pacer.factory.MethodFactory`): every other attribute is read through from them, none copied, and
    nothing it keeps goes unread."""
    cls = _decoder_class()
    assert cls.end_lineno - cls.lineno + 1 <= DECODER_LINES
    assert _self_attributes_set(cls) == {"pair", "methods"}
    read = {n.attr for path in modules().values() for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)}
    assert {"pair", "methods"} <= read


# ------------------------------------------------------------------------------------ docs/architecture.md
DOC = SRC.parent / "docs" / "architecture.md"
#: a dotted name of pacer's (``pacer.pair.LoadSpec``) and a source or test file (``src/pacer/models.py``)
DOTTED = re.compile(r"\bpacer(?:\.[A-Za-z_]\w*)+")
FILE = re.compile(r"\b(?:src/)?pacer/[\w/]+\.py\b|\btests/test_\w+\.py\b")


def _exists(name: str, mods: dict[str, Path]) -> bool:
    """``name`` is a module of pacer's or a name a module defines (``pacer.backends.register``)."""
    parts = name.split(".")
    k = max(i for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in mods)
    if k == len(parts):
        return True  # a module (not imported: ``pacer.__main__`` runs the command line)
    obj = importlib.import_module(".".join(parts[:k]))
    for attr in parts[k:]:
        if not hasattr(obj, attr):
            return False
        obj = getattr(obj, attr)
    return True


def test_the_architecture_page_names_what_exists():
    """Every module, name and file that docs/architecture.md names exists (a renamed or moved one fails here)."""
    text = DOC.read_text()
    mods = modules()
    missing = sorted(n for n in set(DOTTED.findall(text)) if not _exists(n, mods))
    root = SRC.parent
    missing += sorted(f for f in set(FILE.findall(text))
                      if not (root / f if f.startswith(("src/", "tests/")) else SRC / f).exists())
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"


def test_the_architecture_page_draws_this_layout():
    """The page's diagram lists each built-in backend's file and the layers of this module's rules, and states the
    limits these tests check (the Decoder's size)."""
    text = DOC.read_text()
    diagram = text[text.index("## The parts"):text.index("## Arrows that must never exist")]
    backends_files = sorted(p.name for p in BACKENDS_DIR.glob("*.py"))
    assert all(f in diagram for f in backends_files), backends_files
    assert all(m in diagram for m in ("pacer.models", "pacer.pair", "pacer.factory", "pacer.api.Decoder",
                                      "pacer.decoding", "pacer.methods", "pacer.request"))
    assert f"at most {DECODER_LINES} lines" in text
    assert "`pacer.models` is backend-independent" in text and "No import cycle" in text


# ------------------------------------------------------------------------------------ pricing in one place
#: what ``DraftPolicy`` may declare: what decides a length and the hooks around it; what a round costs and what
#: extra work it may do is :mod:`pacer.pricing`'s
POLICY_METHODS = {"reset", "should_continue", "update", "report", "prepare", "prefilled", "set_reference",
                  "survival", "survival_next", "describe"}
#: a cost curve's readers (:class:`pacer.costs.Costs`): only the pricer reads them where rounds are decided
COST_READS = {"target_cost", "tree_cost", "draft_cost", "draft_prefill", "policy_per_check"}
#: the modules where rounds are decided: the policies, the drafters and the loop
DECIDING = (f"{ROOT}.policies", f"{ROOT}.drafters", f"{ROOT}.decoding")
#: the longest class a drafter or the pricer may have (two screens)
CLASS_LINES = 200


def _methods(path: Path, name: str) -> set[str]:
    cls = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == name)
    return {n.name for n in cls.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("__")}


def _cost_names(path: Path, name: str) -> set[str]:
    """The names a class declares (methods, attributes, annotated attributes) that speak of costs or pricing."""
    cls = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == name)
    names = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    names |= {t.id for n in cls.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    names |= {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    return {n for n in names if re.search(r"pric|cost", n, re.I)}


def test_draft_policy_has_nothing_about_costs(tmp_path):
    """The pricer is no passenger of the length policy: the factory builds it and the loop receives it as its own
    argument; ``DraftPolicy`` declares no method or attribute about costs (a ``pricer`` on it fails here)."""
    assert not _cost_names(SRC / ROOT / "policies" / "base.py", "DraftPolicy")
    planted = tmp_path / "base.py"
    planted.write_text("class DraftPolicy:\n    pricer: object = None\n    def cost_report(self): ...\n")
    assert _cost_names(planted, "DraftPolicy") == {"pricer", "cost_report"}
    import inspect

    from pacer.decoding import speculative_generate

    assert "pricer" in inspect.signature(speculative_generate).parameters


def test_draft_policy_decides_lengths_and_prices_nothing():
    """``DraftPolicy`` keeps what decides a length; a pricing call (``branch_room``, ``draft_rate`` ...) added to it
    fails here: it belongs to :class:`pacer.pricing.Pricer`."""
    methods = _methods(SRC / ROOT / "policies" / "base.py", "DraftPolicy")
    assert methods <= POLICY_METHODS, f"DraftPolicy declares {sorted(methods - POLICY_METHODS)} (pacer.pricing's)"
    priced = _methods(SRC / ROOT / "pricing.py", "Pricer")
    assert {"draft_rate", "phrase_rate", "branch_room", "sibling_room", "phrase_room"} <= priced
    assert not priced & POLICY_METHODS


def _cost_reads(path: Path) -> set[str]:
    return {n.attr for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute)} & COST_READS


def test_only_the_pricer_reads_a_cost_curve_where_rounds_are_decided(tmp_path):
    """No policy, drafter or loop module prices a forward itself (``costs.target_cost(k)``, ``c.draft_prefill``):
    each asks the generation's pricer, so every cost of a round is priced by one object."""
    deciding = {m: p for m, p in modules().items() if m.startswith(DECIDING)}
    assert len(deciding) > 10
    found = {m: sorted(r) for m, p in deciding.items() if (r := _cost_reads(p))}
    assert not found, f"these price rounds outside pacer.pricing: {found}"
    planted = tmp_path / "rule.py"
    planted.write_text("def pays(costs, n):\n    return costs.target_cost(n + 1) < 2 * costs.target_cost(1)\n")
    assert _cost_reads(planted) == {"target_cost"}
    assert _cost_reads(SRC / ROOT / "pricing.py") >= {"target_cost", "tree_cost", "draft_cost", "draft_prefill"}


#: the modules that may read a cost curve: the pricer and the costs' own arithmetic; beside them only the cost
#: sources and displays: a profile (its own curves carry the same names), the calibration (what it measured: its
#: plot and its one-line regime) and the command line's calibrate table
COST_HOMES = {f"{ROOT}.pricing", f"{ROOT}.costs"}
COST_SOURCES = {f"{ROOT}.profiles", f"{ROOT}.calibration", f"{ROOT}.cli"}


def test_no_module_outside_the_pricer_reads_a_cost_curve(tmp_path):
    """Every module that decides or prices anything (policies, drafters, the loop, the factory, the API, the vLLM
    proposer, the training wing's validation) asks :mod:`pacer.pricing`; a planted read in any of them fails."""
    mods = modules()
    assert {f"{ROOT}.integrations.vllm", f"{ROOT}.preverify.validation", f"{ROOT}.factory"} <= set(mods)
    found = {m: sorted(r) for m, p in mods.items()
             if m not in COST_HOMES | COST_SOURCES and (r := _cost_reads(p))}
    assert not found, f"these read cost curves outside pacer.pricing: {found}"
    planted = tmp_path / "vllm.py"
    planted.write_text("def allocate(costs, n):\n    return costs.policy_per_check * n\n")
    assert _cost_reads(planted) == {"policy_per_check"}


def _round_time_functions(path: Path) -> set[str]:
    """The functions of a module that write a round's drafting time ``c_d + c_p`` (or ``n c_d + k c_p``)."""
    out = set()
    for fn in ast.walk(ast.parse(path.read_text())):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for n in ast.walk(fn):
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add):
                attrs = {a.attr for side in (n.left, n.right) for a in ast.walk(side) if isinstance(a, ast.Attribute)}
                if {"draft", "policy_per_check"} <= attrs:
                    out.add(fn.name)
    return out


def test_the_round_time_is_written_in_one_function(tmp_path):
    """``T_n = n (c_d + c_p) + c_t(n + 1)`` is :func:`pacer.pricing.round_seconds`, on one token's ``c_d + c_p``
    (:func:`pacer.pricing.token_seconds`); every other reader calls them."""
    found = {f"{m}.{f}" for m, p in modules().items() for f in _round_time_functions(p)}
    assert found == {f"{ROOT}.pricing.round_seconds", f"{ROOT}.pricing.token_seconds"}, found
    planted = tmp_path / "rule.py"
    planted.write_text("def T(c, n):\n    return n * (c.draft + c.policy_per_check) + c.target_cost(n + 1)\n")
    assert _round_time_functions(planted) == {"T"}


def test_drafters_and_the_pricer_have_no_class_longer_than_two_screens():
    long = {}
    for m, path in modules().items():
        if m.startswith(f"{ROOT}.drafters") or m == f"{ROOT}.pricing":
            for n in ast.walk(ast.parse(path.read_text())):
                if isinstance(n, ast.ClassDef) and n.end_lineno - n.lineno + 1 > CLASS_LINES:
                    long[f"{m}.{n.name}"] = n.end_lineno - n.lineno + 1
    assert not long, long


def _block_attributes(path: Path) -> set[int]:
    """Lines of ``path`` that read or set an attribute named ``block`` (``x.block``)."""
    nodes = ast.walk(ast.parse(path.read_text()))
    return {n.lineno for n in nodes if isinstance(n, ast.Attribute) and n.attr == "block"}


def test_block_has_a_name_per_meaning(tmp_path):
    """Three things are called a block, each named apart in the code: the pre-verification layer's ``block_size``,
    block verification (``verify="block"``, a string) and the cache's ``file_block``; an attribute named plain
    ``block`` (``self.block``, ``args.block``) fails here. The user-facing names (the ``block`` option, ``--block``,
    ``--verify block``) are strings, not attributes."""
    found = {m: lines for m, p in modules().items() if (lines := _block_attributes(p))}
    assert not found, f"attributes named plain 'block' (block_size, file_block or verify='block'): {found}"
    planted = tmp_path / "layer.py"
    planted.write_text("class L:\n    def __init__(self, block):\n        self.block = block\n")
    assert _block_attributes(planted) == {3}


def _length_switches(path: Path) -> set[str]:
    """The classes of ``path`` with a ``length`` switch: an ``__init__`` argument or an attribute set on ``self``."""
    out = set()
    for cls in ast.walk(ast.parse(path.read_text())):
        if not isinstance(cls, ast.ClassDef):
            continue
        for fn in cls.body:
            if isinstance(fn, ast.FunctionDef) and fn.name == "__init__" and \
                    "length" in {a.arg for a in fn.args.args + fn.args.kwonlyargs}:
                out.add(cls.name)
        for n in ast.walk(cls):
            if isinstance(n, ast.Attribute) and n.attr == "length" and isinstance(n.ctx, ast.Store) \
                    and isinstance(n.value, ast.Name) and n.value.id == "self":
                out.add(cls.name)
    return out


def test_no_policy_has_a_length_switch(tmp_path):
    """A policy decides the draft length; a literal rule whose extras are priced is that rule and a pricer, never a
    cost rule told not to decide (``CostAwarePolicy(length=False)``). Fails where any class of
    :mod:`pacer.policies` (``CostAwarePolicy`` included) takes or keeps a ``length`` switch."""
    found = {f"{m}.{c}" for m, p in modules().items() if m.startswith(f"{ROOT}.policies")
             for c in _length_switches(p)}
    assert not found, found
    import inspect

    from pacer.policies.cost_aware import CostAwarePolicy

    assert "length" not in inspect.signature(CostAwarePolicy).parameters
    planted = tmp_path / "rule.py"
    planted.write_text("class Rule:\n    def __init__(self, inner, length=True):\n        self.inner = inner\n"
                       "class Other:\n    def reset(self):\n        self.length = False\n")
    assert _length_switches(planted) == {"Rule", "Other"}
