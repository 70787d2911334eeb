"""The pools and tensors SGLang 0.5.23 allocates, one builder per pool class, in bytes (pages
and slots) and in SGLang's own buffer views (elements)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hisparse_plan.models.plan import KVCacheTensor
from hisparse_plan.models.pools import BufferDType, BufferView, PageRange, Pool
from hisparse_plan.models.sglang_plan import SGLangEmptyMambaPool
from hisparse_plan.targets.sglang.buffers import (
    CONV_STATE,
    HOST_KV_BUFFER,
    INDEX_K,
    K_BUFFER,
    KV_BUFFER,
    KV_SCORE,
    SPLIT_V_POOLS,
    TEMPORAL_STATE,
    V_BUFFER,
)
from hisparse_plan.targets.sglang.deepseek_v4.sizing import v4_page_bytes, v4_pages
from hisparse_plan.targets.sglang.model import INDEX_ROW_BYTES, HeadGroup, MambaGroup
from hisparse_plan.targets.sglang.sizing import element_size


@dataclass(frozen=True)
class Placed:
    """Pools and the tensors that live in them."""

    pools: tuple[Pool, ...]
    tensors: tuple[KVCacheTensor, ...]

    def __add__(self, other: Placed) -> Placed:
        return Placed(self.pools + other.pools, self.tensors + other.tensors)


def _view(
    name: str, dtype: str, shape: list[int], storage_offset: int = 0
) -> BufferView:
    """A contiguous (row-major) view of `shape` starting `storage_offset` elements in."""
    strides = [1] * len(shape)
    for axis in range(len(shape) - 2, -1, -1):
        strides[axis] = strides[axis + 1] * shape[axis + 1]
    return BufferView(
        name=name, dtype=_buffer_dtype(dtype), shape=shape, strides=strides,
        storage_offset=storage_offset,
    )


def _buffer_dtype(dtype: str) -> BufferDType:
    names: dict[str, BufferDType] = {
        "uint8": "uint8", "int8": "int8", "bfloat16": "bfloat16", "float16": "float16",
        "float32": "float32", "int32": "int32", "int64": "int64", "int16": "int16",
    }
    return names[dtype]


def _paged_pool(name: str, size: int, pages: int, page_size: int) -> Pool:
    return Pool(
        name=name, location="device", allocation="per_layer", size=size, num_blocks=pages,
        block_tokens=page_size, padding_blocks=1,
    )


def mha_pool(
    name: str, group: HeadGroup, tokens: int, page_size: int, dtype: str
) -> Placed:
    """SGLang's MHA token pool (NHD layout): every layer has `tokens + page_size` rows of K and
    of V (page 0 pads). With K and V of one shape, each layer is ONE allocation
    [2, rows rounded up to a page, heads, head_dim], K its first half and V its second
    (k_buffer / v_buffer views); with different head sizes, K and V are separate allocations
    (pools `name` and `name`_v). Its blocks are the allocator's pages, rows // page_size (its
    PagedTokenToKVPoolAllocator's size // page_size and page 0): a window pool capped at an
    unaligned max_total_tokens keeps rows past its last whole page that it never hands out."""
    rows = tokens + page_size
    padded = -(-rows // page_size) * page_size
    pages = rows // page_size
    size = element_size(dtype)
    k_row = group.heads * group.head_dim
    layers = list(group.names)
    if group.head_dim == group.v_head_dim:
        half = padded * k_row
        page = page_size * k_row * size
        pool = _paged_pool(name, 2 * half * size, pages, page_size)
        tensor = KVCacheTensor(
            size=pool.size, layers=layers, layer_stride=0, block_stride=page, offset=0,
            host_resident=False, pool=name,
            ranges=[PageRange(offset=0, size=page), PageRange(offset=half * size, size=page)],
            views=[
                _view(K_BUFFER, dtype, [rows, group.heads, group.head_dim]),
                _view(V_BUFFER, dtype, [rows, group.heads, group.head_dim], half),
            ],
        )
        return Placed((pool,), (tensor,))
    k = _rows_pool(name, K_BUFFER, layers, rows, page_size, [group.heads, group.head_dim], dtype)
    v = _rows_pool(
        SPLIT_V_POOLS[name], V_BUFFER, layers, rows, page_size, [group.heads, group.v_head_dim],
        dtype,
    )
    return k + v


def _rows_pool(
    name: str,
    view: str,
    layers: list[str],
    rows: int,
    page_size: int,
    row_shape: list[int],
    dtype: str,
) -> Placed:
    """A per-layer pool of `rows` token rows of `row_shape` elements (page 0 pads)."""
    row_bytes = element_size(dtype)
    for extent in row_shape:
        row_bytes *= extent
    page = page_size * row_bytes
    pool = _paged_pool(name, rows * row_bytes, rows // page_size, page_size)
    tensor = KVCacheTensor(
        size=pool.size, layers=layers, layer_stride=0, block_stride=page, offset=0,
        host_resident=False, pool=name, ranges=[PageRange(offset=0, size=page)],
        views=[_view(view, dtype, [rows, *row_shape])],
    )
    return Placed((pool,), (tensor,))


def latent_pool(
    layers: tuple[str, ...], tokens: int, page_size: int, row_elements: int, dtype: str
) -> Placed:
    """SGLang's MLA / DSA latent pool (`kv`): every layer one buffer [tokens + page_size, 1,
    row] (page 0 pads), fp8 stored as uint8."""
    return _rows_pool(
        "kv", KV_BUFFER, list(layers), tokens + page_size, page_size, [1, row_elements], dtype
    )


def index_pool(layers: tuple[str, ...], index_tokens: int, page_size: int) -> Placed:
    """SGLang's DSA index keys (`index`): every indexer layer one uint8 buffer [pages,
    page_size * 132], pages = (index tokens + page_size + 1) // page_size (page 0 included);
    a page holds its 64 tokens' fp8 keys, then their scales."""
    pages = (index_tokens + page_size + 1) // page_size
    page = page_size * INDEX_ROW_BYTES
    pool = _paged_pool("index", pages * page, pages, page_size)
    tensor = KVCacheTensor(
        size=pool.size, layers=list(layers), layer_stride=0, block_stride=page, offset=0,
        host_resident=False, pool="index", ranges=[PageRange(offset=0, size=page)],
        views=[_view(INDEX_K, "uint8", [pages, page])],
    )
    return Placed((pool,), (tensor,))


def hisparse_host_pool(
    layers: tuple[str, ...], host_tokens: int, page_size: int, row_elements: int, dtype: str
) -> Placed:
    """HiSparse's pinned host pool (`hisparse_host`): one layer-first allocation [layers,
    host tokens, 1, row] holding every token's latent row; index keys stay on the GPU."""
    row = row_elements * element_size(dtype)
    layer_bytes = host_tokens * row
    pool = Pool(
        name="hisparse_host", location="host", allocation="whole",
        size=layer_bytes * len(layers), num_blocks=host_tokens // page_size,
        block_tokens=page_size, padding_blocks=1,
    )
    tensor = KVCacheTensor(
        size=pool.size, layers=list(layers), layer_stride=layer_bytes,
        block_stride=page_size * row, offset=0, host_resident=True, pool="hisparse_host",
        ranges=[PageRange(offset=0, size=page_size * row)],
        views=[_view(HOST_KV_BUFFER, dtype, [len(layers), host_tokens, 1, row_elements])],
    )
    return Placed((pool,), (tensor,))


def mamba_pools(group: MambaGroup, slots: int, conv_dtype: str, ssm_dtype: str) -> Placed:
    """SGLang's MambaPool: slot-indexed and layer-first, one allocation per state, [Mamba
    layers, slots + 1, *state] (slot 0 pads): `mamba_conv0` (conv[0], (dim, kernel - 1)) and
    `mamba_temporal`."""
    placed = Placed((), ())
    for name, view, shape, dtype in _mamba_states(group, conv_dtype, ssm_dtype):
        placed += mamba_state_pool(name, view, group.names, slots + 1, shape, dtype)
    return placed


def empty_mamba_pools(
    group: MambaGroup, slots: int, conv_dtype: str, ssm_dtype: str
) -> list[SGLangEmptyMambaPool]:
    """SGLang's MambaPool on a pipeline rank that keeps none of the model's Mamba layers: each
    state's buffer over its empty layer slice, [0, slots + 1, *state], no byte."""
    return [SGLangEmptyMambaPool(name=name, slots=slots,
                                 view=_view(view, dtype, [0, slots + 1, *shape]))
            for name, view, shape, dtype in _mamba_states(group, conv_dtype, ssm_dtype)]


def _mamba_states(
    group: MambaGroup, conv_dtype: str, ssm_dtype: str
) -> tuple[tuple[Literal["mamba_conv0", "mamba_temporal"], str, tuple[int, ...], str], ...]:
    """(pool, SGLang's buffer, one layer's state shape, dtype) of each Mamba state."""
    return (("mamba_conv0", CONV_STATE, group.conv_shape, conv_dtype),
            ("mamba_temporal", TEMPORAL_STATE, group.temporal_shape, ssm_dtype))


def mamba_state_pool(
    name: str, view: str, layers: tuple[str, ...], blocks: int, shape: tuple[int, ...],
    dtype: str,
) -> Placed:
    """One slot-indexed, layer-first state allocation [layers, blocks, *shape] (block 0
    pads)."""
    slot = element_size(dtype)
    for extent in shape:
        slot *= extent
    layer_bytes = blocks * slot
    pool = Pool(
        name=name, location="device", allocation="whole", size=layer_bytes * len(layers),
        num_blocks=blocks, block_tokens=1, padding_blocks=1,
    )
    tensor = KVCacheTensor(
        size=pool.size, layers=list(layers), layer_stride=layer_bytes, block_stride=slot,
        offset=0, host_resident=False, pool=name, ranges=[PageRange(offset=0, size=slot)],
        views=[_view(view, dtype, [len(layers), blocks, *shape])],
    )
    return Placed((pool,), (tensor,))


def req_to_token_view(rows: int, width: int) -> BufferView:
    """SGLang's request-to-token table: int32 [rows, width], row 0 pads."""
    return _view("req_to_token", "int32", [rows, width])


def _per_layer_pool(
    name: str,
    layers: tuple[str, ...],
    block: tuple[int, int, int],
    view: BufferView,
    size: int,
    *,
    host: bool = False,
) -> Placed:
    """A per-layer pool whose blocks are `block` = (count, tokens, bytes) apart from byte 0,
    viewed by `view`: on the GPU block 0 pads; a host pool hands out every block."""
    count, tokens, nbytes = block
    pool = Pool(
        name=name, location="host" if host else "device", allocation="per_layer", size=size,
        num_blocks=count, block_tokens=tokens, padding_blocks=0 if host else 1,
    )
    tensor = KVCacheTensor(
        size=size, layers=list(layers), layer_stride=0, block_stride=nbytes, offset=0,
        host_resident=host, pool=name, ranges=[PageRange(offset=0, size=nbytes)],
        views=[view],
    )
    return Placed((pool,), (tensor,))


def host_page_pool(
    name: str, layers: tuple[str, ...], pages: int, slots_per_page: int, page_bytes: int
) -> Placed:
    """A paged host pool (SGLang's DeepSeekV4PagedHostPool, layer first): every layer one
    uint8 buffer [pages, page bytes], no padding page."""
    view = _view(KV_BUFFER, "uint8", [pages, page_bytes])
    return _per_layer_pool(name, layers, (pages, slots_per_page, page_bytes), view,
                           pages * page_bytes, host=True)


def v4_kv_pool(
    name: str, layers: tuple[str, ...], size: int, slots_per_page: int, page_size: int
) -> Placed:
    """SGLang's DeepSeekV4SingleKVPool (`v4_swa`, `v4_c4`, `v4_c128`): every layer one uint8
    buffer [pages, padded page bytes], a page `slots_per_page` 584-byte rows (page_size /
    ratio) padded to a multiple of 576, pages = ceil((size + page_size) / slots_per_page).
    Page 0 pads (the full pool's padding page compresses into it); the last few pages of a
    compressed pool are never reached (SGLang reserves a model page counted in slots)."""
    pages = v4_pages(size, slots_per_page, page_size)
    page = v4_page_bytes(slots_per_page)
    view = _view(KV_BUFFER, "uint8", [pages, page])
    return _per_layer_pool(name, layers, (pages, slots_per_page, page), view, pages * page)


def v4_index_pool(
    layers: tuple[str, ...], size: int, slots_per_page: int, page_size: int, key_bytes: int
) -> Placed:
    """SGLang's DeepSeekV4IndexerPool (`v4_index_c4`): every c4 layer one uint8 buffer [pages,
    slots_per_page * key bytes] with as many pages as the c4 pool of `size` slots."""
    pages = v4_pages(size, slots_per_page, page_size)
    page = slots_per_page * key_bytes
    view = _view(INDEX_K, "uint8", [pages, page])
    return _per_layer_pool("v4_index_c4", layers, (pages, slots_per_page, page), view,
                           pages * page)


def v4_state_pool(
    name: str, layers: tuple[str, ...], rows: int, width: int, ring: int, rings: int
) -> Placed:
    """SGLang's CompressStatePool (`v4_state_c4`, `v4_state_c128`, `v4_index_state_c4`): every
    layer one float32 buffer [rows, width] (kv then score values). A block is one ring of
    `ring` rows, `rings` of them: per window page for ratio 4, per request slot for ratio 128
    (ring 0 belongs to padding page 0 / request slot 0)."""
    row = width * element_size("float32")
    view = _view(KV_SCORE, "float32", [rows, width])
    return _per_layer_pool(name, layers, (rings, ring, ring * row), view, rows * row)
