"""Whisper's fixture and the reader's request for it (vLLM's engine defaults on this host)."""

from __future__ import annotations

import json
from typing import Any

from hisparse_plan.presets import Settings, build_request
from hisparse_plan.presets.config_file import model_from_config
from support import paths

WHISPER = paths.HF_CONFIGS / "whisper-small" / "config.json"


GIB = 2**30


def whisper_config() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(WHISPER.read_text())
    return loaded


def whisper_request(*, memory: int = GIB, layout: str = "BLNHC", tokens: int = 2048,
                    **scheduler: Any) -> dict[str, Any]:
    """The reader's request for the fixture, with the memory, layout and scheduler figures of
    vLLM's run below (its engine defaults for Whisper on this host: 2048 batched tokens)."""
    arch = model_from_config(whisper_config(), origin="whisper", use_transformers=False)
    request = build_request(arch, Settings()).model_dump(mode="json")
    request["device"].update(available_bytes=memory, kv_cache_layout=layout)
    request["scheduler"].update(max_num_batched_tokens=tokens, **scheduler)
    return request
