"""transformers' decoder language models against vLLM 0.34, pinned without vLLM.

tests/vllm_transformers_sweep.json holds what references/vllm_transformers_sweep.py found for
each decoder model_type of transformers' causal-LM enumeration (and published checkpoints and
fixtures of architectures vLLM's registry does not name): the config, and where vLLM 0.34
built it on the meta device, the class it resolved and the cache layers it built; where vLLM
refused it, that it did. Here the reader reads each stored config again: where it agreed it must
still give vLLM's class and layers exactly; where vLLM refused (or built no cache), it must
refuse. docs/vllm-transformers-sweep.md is the same table for people: its counts must be this
file's.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

import pytest

from hisparse_plan.errors import PlanError
from hisparse_plan.presets import Settings, build_request
from hisparse_plan.presets.config_file import model_from_config
from hisparse_plan.presets.resolution import vllm_model_class
from support import paths
from support.meta_layers import meta_layers

HERE = paths.TESTS
TABLE: dict[str, dict[str, Any]] = json.loads((HERE / "vllm_transformers_sweep.json").read_text())
DOC = (HERE.parent / "docs" / "vllm-transformers-sweep.md").read_text()
BUILT = ("same", "differ", "reader_refuses", "unmodelled_kind", "no_cache_both")
REFUSED = ("refused_by_both", "reader_plans")
STATUSES = (*BUILT, *REFUSED, "no_config", "vllm_cannot_build", "sweep_error",
            "defaults_incomplete")


def by_status(*statuses: str) -> list[str]:
    return sorted(name for name, entry in TABLE.items() if entry["status"] in statuses)


def reader_layers(name: str) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The reader's own-cache layers with vLLM's model facts, and its cross-layer sharing
    (without transformers where the stored config is transformers' whole to_dict already;
    through it for a published config.json, as the sweep read it)."""
    published = not name.startswith(("type:", "arch:"))
    if published:
        pytest.importorskip("transformers")
    entry = TABLE[name]
    arch = model_from_config(entry["config"], origin="sweep", use_transformers=published,
                             vllm_serves=True)
    # A refused entry has no length vLLM took: any length, so that a refusal is the model's.
    request = build_request(arch, Settings(max_model_len=entry.get("length", 4096),
                                           allow_long_context="length" not in entry))
    return meta_layers(request)


def test_the_table_covers_the_enumeration_and_the_doc_counts_it() -> None:
    counts = Counter(entry["status"] for entry in TABLE.values())
    assert set(counts) <= set(STATUSES)
    assert len(TABLE) >= 140  # transformers 5.20: about 150 decoder model_types
    built = sum(counts[status] for status in BUILT)
    summary = re.search(r"(\d+) configs: (\d+) built on meta .*?, (\d+) equal, (\d+) differing",
                        DOC)
    assert summary is not None
    assert tuple(map(int, summary.groups())) == (len(TABLE), built, counts["same"],
                                                 counts["differ"])
    for name in TABLE:
        assert f"| {name} |" in DOC, name


def test_every_config_vllm_builds_is_planned_as_vllm_builds_it() -> None:
    assert by_status("differ", "reader_refuses", "reader_plans") == []


@pytest.mark.parametrize("name", by_status("same"))
def test_the_reader_gives_the_class_and_layers_vllm_built(name: str) -> None:
    entry = TABLE[name]
    layers, shared = reader_layers(name)
    assert vllm_model_class(entry["config"]) == entry["model_class"]
    assert list(layers) == list(entry["layers"])
    for layer, facts in entry["layers"].items():
        assert layers[layer] == facts, layer
    assert shared == entry.get("shared", {})


@pytest.mark.parametrize("name", by_status("refused_by_both", "no_cache_both"))
def test_what_vllm_refuses_the_reader_refuses(name: str) -> None:
    with pytest.raises(PlanError):
        reader_layers(name)
