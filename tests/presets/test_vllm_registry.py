"""vLLM 0.34's whole registry against the config reader, pinned without vLLM.

tests/vllm_registry.json holds, for every text-generation and multimodal architecture of vLLM
0.34's registry, what references/vllm_family_sweep.py --registry-build found: the config it used
(transformers' own class at small size, or a fixture), and where vLLM's model class built on the
meta device, the cache layers it built (facts of `MODEL_FACTS`, layers that read another's
cache) and whether the reader agreed. Here the reader reads each stored config again: where it
agreed it must still give vLLM's layers exactly; where it refused it must still refuse (a reader
that learns a layout fails this until the sweep is run again and the table written anew).
docs/vllm-registry.md is the same table for people: its counts must be this file's.
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
from support import paths
from support.meta_layers import meta_layers

HERE = paths.TESTS
TABLE: dict[str, dict[str, Any]] = json.loads((HERE / "vllm_registry.json").read_text())
DOC = (HERE.parent / "docs" / "vllm-registry.md").read_text()
BUILT = ("same", "differ", "reader_refuses", "unmodelled_kind")
STATUSES = (*BUILT, "no_config", "vllm_cannot_build", "sweep_error")


def by_status(*statuses: str) -> list[str]:
    return sorted(arch for arch, entry in TABLE.items() if entry["status"] in statuses)


def reader_layers(entry: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The reader's own-cache layers with vLLM's model facts, and its cross-layer sharing."""
    # Without transformers: the stored config is transformers' whole to_dict already, so the
    # verdict does not hang on the installed transformers version (the sweep reads it so too).
    arch = model_from_config(entry["config"], origin="registry", use_transformers=False)
    request = build_request(arch, Settings(max_model_len=entry["length"]))
    return meta_layers(request)


def test_the_table_covers_the_registry_and_the_doc_counts_it() -> None:
    counts = Counter(entry["status"] for entry in TABLE.values())
    assert set(counts) <= set(STATUSES)
    assert len(TABLE) >= 250  # vLLM 0.34: 126 text-generation and 130 multimodal names
    built = sum(counts[status] for status in BUILT)
    summary = re.search(r"(\d+) architectures: (\d+) built on meta, (\d+) equal", DOC)
    assert summary is not None
    assert tuple(map(int, summary.groups())) == (len(TABLE), built, counts["same"])
    for arch in TABLE:
        assert f"| {arch} |" in DOC, arch


@pytest.mark.parametrize("arch", by_status("same"))
def test_the_reader_gives_the_layers_vllm_built(arch: str) -> None:
    entry = TABLE[arch]
    layers, shared = reader_layers(entry)
    assert list(layers) == list(entry["layers"])
    for name, facts in entry["layers"].items():
        assert layers[name] == facts, name
    assert shared == entry.get("shared", {})


@pytest.mark.parametrize("arch", by_status("reader_refuses"))
def test_a_refused_architecture_is_still_refused(arch: str) -> None:
    with pytest.raises(PlanError):
        reader_layers(TABLE[arch])


@pytest.mark.parametrize("arch", by_status("differ"))
def test_a_differing_architecture_still_differs(arch: str) -> None:
    entry = TABLE[arch]
    try:
        layers, shared = reader_layers(entry)
    except PlanError:
        return  # refusing what it got wrong is no regression
    assert (layers, shared) != (entry["layers"], entry.get("shared", {}))
