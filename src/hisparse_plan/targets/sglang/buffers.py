"""The buffers SGLang 0.5.23 keeps over each of its pools, by the names a plan gives them: the
views layout.py builds for a pool's tensor, one a page range and in range order, and the views
check_plan requires (checking/sglang_roles.py). One table for both, so a plan can carry no
buffer SGLang does not have and lack none it binds."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from types import MappingProxyType
from typing import Final

K_BUFFER: Final = "k_buffer"
V_BUFFER: Final = "v_buffer"
KV_BUFFER: Final = "kv_buffer"
INDEX_K: Final = "index_k"
HOST_KV_BUFFER: Final = "host_kv_buffer"
CONV_STATE: Final = "conv[0]"
TEMPORAL_STATE: Final = "temporal"
KV_SCORE: Final = "kv_score"

Buffers = tuple[str, ...]
"""A tensor's view names, one a page range, in range order."""

SPLIT_V_POOLS: Final[Mapping[str, str]] = MappingProxyType({
    "kv": "kv_v", "swa": "swa_v", "draft_kv": "draft_kv_v", "draft_swa": "draft_swa_v",
})
"""An MHA pool and the pool its V half takes when K and V differ in head size."""

BUFFERS: Final[Mapping[str, tuple[Buffers, ...]]] = MappingProxyType({
    # MHA: K then V in one allocation (MHATokenToKVPool); MLA and DSA: the latent rows.
    "kv": ((K_BUFFER, V_BUFFER), (KV_BUFFER,)),
    "swa": ((K_BUFFER, V_BUFFER),),
    "kv_v": ((V_BUFFER,),),
    "swa_v": ((V_BUFFER,),),
    "index": ((INDEX_K,),),
    # The draft worker's pools (speculative decoding): the target's pool classes.
    "draft_kv": ((K_BUFFER, V_BUFFER), (KV_BUFFER,)),
    "draft_kv_v": ((V_BUFFER,),),
    "draft_swa": ((K_BUFFER, V_BUFFER),),
    "draft_swa_v": ((V_BUFFER,),),
    "draft_index": ((INDEX_K,),),
    "hisparse_host": ((HOST_KV_BUFFER,),),
    "mamba_conv0": ((CONV_STATE,),),
    "mamba_temporal": ((TEMPORAL_STATE,),),
    # Speculative decoding: one state and one conv window a draft token (MambaPool).
    "mamba_intermediate_ssm": (("intermediate_ssm",),),
    "mamba_intermediate_conv0": (("intermediate_conv_window[0]",),),
    "v4_swa": ((KV_BUFFER,),),
    "v4_c4": ((KV_BUFFER,),),
    "v4_hisparse_host": ((KV_BUFFER,),),
    "v4_c128": ((KV_BUFFER,),),
    "v4_index_c4": ((INDEX_K,),),
    "v4_state_c4": ((KV_SCORE,),),
    "v4_index_state_c4": ((KV_SCORE,),),
    "v4_state_c128": ((KV_SCORE,),),
})
"""Every pool's buffers, each alternative a whole set of views (one must match)."""


def pool_buffers(pool: str, pools: Collection[str]) -> tuple[Buffers, ...]:
    """The buffers SGLang may keep over `pool` in a plan of `pools`: an MHA pool beside its V
    pool keeps K alone; a pool SGLang does not have keeps none."""
    v_pool = SPLIT_V_POOLS.get(pool)
    if v_pool is not None and v_pool in pools:
        return ((K_BUFFER,),)
    return BUFFERS.get(pool, ())
