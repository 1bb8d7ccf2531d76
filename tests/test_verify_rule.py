"""``verify=block`` at temperature 0 is handled the same way by every entry point: refused in one line naming the
rule (greedy decoding verifies by exact matching, so the rule would be ignored), by the one check
:func:`pacer.request.verify_problem`; ``token``, greedy's own default, is accepted everywhere."""

from __future__ import annotations

import pytest

from pacer import PacerError, SamplingConfig
from pacer.cli import main
from pacer.request import GenerationRequest, verify_problem
from pacer.serve.protocol import BadRequest, Defaults, parse_request

NEEDS = "needs sampling: greedy decoding (temperature 0)"


def test_the_rule():
    assert NEEDS in verify_problem(0.0, "block")
    assert verify_problem(0.0, "token") is None and verify_problem(0.0, None) is None
    assert verify_problem(0.7, "block") is None


def test_the_api_refuses_it():
    with pytest.raises(PacerError, match="verify \\(block\\) needs sampling"):
        GenerationRequest.of("sd", 8, SamplingConfig(0.0, verify="block"))
    GenerationRequest.of("sd", 8, SamplingConfig(0.0, verify="token"))
    GenerationRequest.of("sd", 8, SamplingConfig(0.5, verify="block"))


def test_a_served_request_refuses_it_and_the_server_rule_applies_to_sampled_requests_only():
    greedy = {"prompt": "x", "temperature": 0}
    with pytest.raises(BadRequest, match="needs sampling"):
        parse_request({**greedy, "pacer": {"verify": "block"}}, False, Defaults("sd"), "m")
    # the server's --verify block is its rule for sampled requests: a greedy request is not refused for it
    assert parse_request(greedy, False, Defaults("sd", verify="block"), "m").sampling.verify == "token"
    assert parse_request({"prompt": "x"}, False, Defaults("sd", verify="block"), "m").sampling.verify == "block"


@pytest.mark.parametrize("argv", [
    ["generate", "x", "--verify", "block"],
    ["generate", "x", "--verify", "block", "--temperature", "0"],
    ["bench", "--quick", "--verify", "block", "--out", "OUT"],
    ["bench", "--quick", "--methods", "ar,sd:verify=block", "--out", "OUT"],
    ["demo", "--verify", "block"],
])
def test_every_command_refuses_it_before_any_model_loads(argv, capsys, tmp_path):
    argv = [a.replace("OUT", str(tmp_path / "run")) for a in argv]
    rc = main([*argv, "--target", "/nonexistent/model", "--draft", "/nonexistent/draft"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--verify" in err[0], err
    assert NEEDS in err[0]
    assert not (tmp_path / "run").exists()


def test_serve_takes_block_as_its_rule_for_sampled_requests(capsys):
    """``pacer serve --verify block`` is not refused at start (its requests sample at OpenAI's default 1.0); the
    start check gets past the rule to the model (here missing)."""
    rc = main(["serve", "--verify", "block", "--target", "/nonexistent/model", "--draft", "/nonexistent/draft"])
    err = capsys.readouterr().err
    assert rc == 2 and "/nonexistent/model" in err and "needs sampling" not in err, err  # the model, not the rule
