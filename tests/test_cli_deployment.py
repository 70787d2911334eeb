"""The deployment flags of the `hisparse-plan` command: the long-context guard, regular
presets, pipeline stages, hardware and speculative decoding."""

from __future__ import annotations

from cli_support import Run


def test_long_context_needs_the_allow_flag(cli: Run) -> None:
    code, out, err = cli("plan", "deepseek-v3.2", "--max-model-len", "200000")
    assert code == 2
    assert out == ""
    assert err.startswith("error: model.max_model_len: expected at most")
    assert "(163840), got 200000" in err
    assert len(err.splitlines()) == 1
    code, out, _ = cli("plan", "deepseek-v3.2", "--max-model-len", "200000",
                       "--allow-long-context", "--json")
    assert code == 0
    assert '"max_model_len": 200000' in out
