"""The method registry is the one place a method is defined: a toy method registered here (and nowhere else)
runs through ``Decoder.generate``, ``pacer generate`` and ``pacer bench --quick``; the README's method table is
the registry's; no module but ``__main__`` imports the command line."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from pacer import PacerError, methods
from pacer.cli import main
from pacer.policies import DraftPolicy
from pacer.tiny import save_tiny_pair

ROOT = Path(__file__).resolve().parents[1]


class EveryOther(DraftPolicy):
    """The toy rule: draft ``stride`` tokens in even rounds, none in odd ones."""

    name = "every-other"

    def __init__(self, stride: int = 2, **bounds) -> None:
        super().__init__(**{"min_draft": 0, "max_draft": 8, **bounds})
        self.stride, self.round = stride, 0

    def reset(self) -> None:
        self.round = 0

    def should_continue(self, state) -> bool:
        return self.round % 2 == 0 and state.n < self.stride

    def update(self, state, result) -> None:
        self.round += 1


TOY = methods.Method("every-other", "toy: drafts in every other round",
                     lambda b: EveryOther(b.options.get("stride", 2), **b.bounds),
                     options=(methods.Option("stride", int, "every-other: tokens per drafting round", minimum=1,
                                             explicit=True),))


@pytest.fixture
def toy():
    methods.register(TOY)
    yield TOY
    methods.unregister(TOY.name)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target, draft = save_tiny_pair(tmp_path_factory.mktemp("methods"))
    return str(target), str(draft)


def test_a_registered_method_runs_through_generate(toy, close):
    ar = close.generate("hello world", "ar", max_new_tokens=20)
    res = close.generate("hello world", "every-other", max_new_tokens=20, options={"stride": 3})
    assert res.token_ids == ar.token_ids
    assert res.stats.draft_lengths[:5] == [0, 3, 0, 3, 0]  # the prefill's token first (no round of the policy's)
    with pytest.raises(PacerError, match="takes no option 'ngram'"):
        close.generate("hello world", "every-other", options={"ngram": 3})
    with pytest.raises(PacerError, match="stride must be >= 1"):
        close.generate("hello world", "every-other", options={"stride": 0})


def test_a_registered_method_runs_through_pacer_generate(toy, pair, capsys):
    target, draft = pair
    argv = ["generate", "hello world", "--json", "--method", "every-other", "--stride", "2", "--max-new-tokens", "12",
            "--target", target, "--draft", draft, "--dtype", "float32", "--threads", "1"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stats"]["draft_lengths"][:3] == [0, 2, 0]
    # its flag is refused for another method, before anything loads
    assert main([*argv[:3], "--method", "sd", *argv[5:]]) == 2
    assert "method 'sd' takes no option 'stride'" in capsys.readouterr().err


def test_a_registered_method_runs_through_pacer_bench(toy, tmp_path, capsys):
    out = tmp_path / "bench"
    assert main(["bench", "--quick", "--n", "1", "--max-new-tokens", "6", "--no-progress", "--out", str(out),
                 "--methods", "ar,every-other:stride=2"]) == 0
    recs = [json.loads(x) for x in (out / "answers.jsonl").read_text().splitlines()]
    assert {r["method"] for r in recs} == {"ar", "every-other:stride=2"}
    assert all(r["lossless"] for r in recs if r["method"] != "ar")
    assert "every-other:stride=2" in (out / "report.md").read_text()


def test_register_refuses_clashes():
    with pytest.raises(PacerError, match="already registered"):
        methods.register(methods.Method("sd", "again", lambda b: None))
    with pytest.raises(PacerError, match="clashes"):
        methods.register(methods.Method("x1", "x", lambda b: None, options=(methods.Option("gamma", int, ""),)))
    with pytest.raises(PacerError, match="differs"):
        methods.register(methods.Method("x2", "x", lambda b: None, options=(methods.Option("threshold", str, ""),)))
    with pytest.raises(PacerError, match="clashes"):  # a setting's flag: argparse would refuse the whole CLI
        methods.register(methods.Method("x3", "x", lambda b: None, options=(methods.Option("seed", int, ""),)))
    with pytest.raises(PacerError, match="needs a drafter factory"):
        methods.register(methods.Method("x4", "x", lambda b: None,
                                        options=(methods.Option("width", int, "", to="drafter"),)))
    assert not {"x1", "x2", "x3", "x4"} & set(methods.names())


def test_a_policy_that_has_its_reference_is_not_given_another(close, monkeypatch):
    """The oracle asks for the target's continuation only while it has none (a declared property, passed through
    the cost-aware wrapper): given its agreement list, no plain-decoding run is made for it."""
    from pacer.policies import OraclePolicy

    ids = close.encode("hello world")
    ref = close.generate(ids, "ar", max_new_tokens=12).token_ids
    agree = close.make_drafter("oracle").agreement(ids, ref)
    calls = []
    real = type(close).generate

    def counting(self, prompt, method="sd", *a, **k):
        calls.append(method)
        return real(self, prompt, method, *a, **k)

    monkeypatch.setattr(type(close), "generate", counting)
    res = close.generate(ids, "oracle", max_new_tokens=12, policy=OraclePolicy(agree))
    assert res.token_ids == ref and calls == ["oracle"]
    close.generate(ids, "oracle", max_new_tokens=12)  # no agreement given: one plain run makes it
    assert calls == ["oracle", "oracle", "ar"]
    aware = close.make_policy("oracle", cost_aware=True)
    assert aware.needs_reference and (aware.set_reference(agree) or not aware.needs_reference)


def test_readme_method_table_is_the_registry():
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- methods -->\n(.*?)\n<!-- /methods -->", readme, re.S)
    assert m, "README.md lacks the <!-- methods --> table"
    assert m.group(1).strip() == methods.table()


def test_no_module_imports_the_command_line():
    """Arrows that must never exist (docs/architecture.md): only ``__main__`` imports ``pacer.cli``; the core
    (decoding, policies, methods, api) imports neither the command line, nor argument parsing, nor the bench."""
    src = ROOT / "src" / "pacer"
    core = ("decoding", "drafters", "policies", "methods", "api.py", "costs.py", "sampling.py")
    for path in src.rglob("*.py"):
        rel = path.relative_to(src).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom):
                package = ["pacer", *rel.split("/")[:-1]]  # the package the module is in
                base = package[: len(package) - node.level + 1] if node.level else []
                full = ".".join([*base, *([node.module] if node.module else [])])
                names = [full] + [f"{full}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if rel != "__main__.py":
                cli = [n for n in names if n == "pacer.cli" or n.startswith("pacer.cli.")]
                assert not cli, f"{rel} imports pacer.cli"
            if rel.startswith(core):
                bad = [n for n in names if n.startswith(("pacer.args", "pacer.bench", "pacer.cli"))]
                assert not bad, f"{rel} (core) imports {bad}"
