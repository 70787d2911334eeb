"""The same public config.json files read through transformers' own config classes (the `hf`
extra): transformers' defaults fill what the files leave out (Gemma-3 as shipped), and every
layer kind agrees with the fallback reader's wherever that one plans."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_hf_configs import CONFIGS, KINDS, NAMES, config, kinds_or_refusal

from hisparse_plan.presets import ConfigError, RegularArchitecture
from hisparse_plan.presets.config_file import model_from_config
from support.cli_support import Run

pytest.importorskip("transformers")


@pytest.mark.parametrize("name", NAMES)
def test_kinds_through_transformers(name: str) -> None:
    assert kinds_or_refusal(name, use_transformers=True) == KINDS[name]


def test_gemma3_as_shipped_takes_transformers_defaults(cli: Run, tmp_path: Path) -> None:
    arch = model_from_config(config("gemma-3-4b-it"), origin="gemma-3-4b")
    assert isinstance(arch, RegularArchitecture)
    assert (arch.model_type, arch.num_hidden_layers) == ("gemma3_text", 34)
    # Gemma3TextConfig's defaults: 8 heads, 4 KV heads of 256, a 131072-token context.
    assert arch.num_key_value_heads == 4
    assert arch.head_size == 256
    assert arch.max_position_embeddings == 131072
    folder = tmp_path / "gemma"
    folder.mkdir()
    (folder / "config.json").write_text((CONFIGS / "gemma-3-4b-it" / "config.json").read_text())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 8_600_000_000}}))
    code, out, err = cli("plan", "--hf-config", str(folder / "config.json"), "--gpu", "h200",
                         "--tp", "2", "--json")
    assert code == 0, err
    assert json.loads(out)["memory"]["deployment"]["weights_bytes"] == 8_600_000_000


def test_qwen2_without_sliding_window_has_no_window() -> None:
    arch = model_from_config(config("qwen2.5-7b-instruct"), origin="qwen")
    # transformers drops the window when use_sliding_window is false.
    assert arch.sliding_window is None  # type: ignore[union-attr]


def test_a_config_transformers_refuses_is_refused() -> None:
    fields = {**config("llama-3.1-8b-instruct"), "num_hidden_layers": "many"}
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        model_from_config(fields, origin="llama")


def test_a_config_class_transformers_cannot_import_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """transformers' Gemma-3n config module imports timm where timm is installed; a timm
    without torchvision made that import fail, and the reading ended in an internal error."""
    auto = pytest.importorskip("transformers.models.auto.configuration_auto")

    class Broken(dict[str, object]):
        def __contains__(self, key: object) -> bool:
            return True

        def __getitem__(self, key: str) -> object:
            try:
                import torchvision_absent_for_this_test  # type: ignore[import-not-found]  # noqa: F401
            except ModuleNotFoundError as error:
                raise ModuleNotFoundError(f"Could not import module {key!r}") from error
            return None

    monkeypatch.setattr(auto, "CONFIG_MAPPING", Broken())
    with pytest.raises(ConfigError, match=r"gemma-3n: model_type: transformers cannot import "
                                          r"its config class for 'gemma3n' .*"
                                          "torchvision_absent_for_this_test") as caught:
        model_from_config(config("gemma-3n-e4b-it"), origin="gemma-3n")
    assert caught.value.field == "model_type"
