"""Whether two instances laid their KV cache out so that pages can move between them as bytes.

Transfer-compatible means: the same transferred layers (by name; the resident and hot layers
HiSparse derives on the GPU are not transferred), and for each the same dtype, page bytes,
tokens per block, per-block shape and byte strides, and place of the page inside its block
(`block_offset`); and no layer a transfer refuses (`LayerEntry.refused`), and each layer that
reads another's pages reading the same layer's on both sides: the rules `transfer` applies,
from exchange/movable.py, not derived again here. Then page `b` of a layer on one side holds
every element at the same byte of the page as page `b'` on the other (the strides fix the
in-page offset of every element, and so of every contiguous run), and with blocks outermost a
layer's page sits at the same byte of either side's block. Strides of axes of extent 1 address
nothing and are not compared.

What may differ: num_blocks, and so pool sizes and, with layers outermost, where each layer's
slab starts. A prefill and a decode instance rarely have the same memory; a transfer engine
addresses each side's pages through that side's own manifest (offset + b * block_stride). Two
plans of one layout have one fingerprint; compatible plans need not.
"""

from __future__ import annotations

from typing import Final

from hisparse_plan.exchange.manifest import LayerEntry, TransferManifest, manifest
from hisparse_plan.exchange.movable import sharing_difference
from hisparse_plan.models import KVCachePlan
from hisparse_plan.models.base import Model

Value = str | int | bool | list[int]
LAYOUT_FIELDS: Final = (
    "dtype", "page_bytes", "tokens_per_block", "block_shape", "block_strides", "block_offset",
)
"""Compared in this order; the first that differs is reported."""


class TransferCompatibility(Model):
    compatible: bool
    same_fingerprint: bool
    """Identical layouts, block counts and placement included."""
    layers_compared: int
    layer: str | None = None
    """The first layer that differs (in the first side's layer order)."""
    field: str | None = None
    """What differs: one of LAYOUT_FIELDS, "present" when one side lacks the layer, "kind"
    when a side keeps it as a kind a transfer does not move, "kv_sharing_target" when it
    reads another layer's pages on one side and not the same layer's on the other."""
    a: Value | None = None
    b: Value | None = None
    message: str


def _page_values(entry: LayerEntry) -> dict[str, Value]:
    strides = [
        stride if extent > 1 else 0
        for stride, extent in zip(entry.block_strides, entry.block_shape, strict=True)
    ]
    return {
        "dtype": entry.dtype,
        "page_bytes": entry.page_bytes,
        "tokens_per_block": entry.tokens_per_block,
        "block_shape": list(entry.block_shape),
        "block_strides": strides,
        "block_offset": entry.block_offset,
    }


def _transferred(side: TransferManifest) -> dict[str, LayerEntry]:
    return {entry.name: entry for entry in side.layers if not entry.derived}


def diff(
    a: KVCachePlan | TransferManifest, b: KVCachePlan | TransferManifest
) -> TransferCompatibility:
    """Compare two plans (or their manifests) for KV transfer (module doc): compatible, or
    the first layer that differs and which field, with both sides' values."""
    left = a if isinstance(a, TransferManifest) else manifest(a)
    right = b if isinstance(b, TransferManifest) else manifest(b)
    same = left.fingerprint == right.fingerprint
    ours, theirs = _transferred(left), _transferred(right)

    def differs(layer: str, field: str, in_a: Value, in_b: Value) -> TransferCompatibility:
        if field == "present":
            message = f"layer {layer!r} is transferred by {'A' if in_a else 'B'} only"
        else:
            message = f"layer {layer!r}: {field} differs: A has {in_a}, B has {in_b}"
        return TransferCompatibility(
            compatible=False, same_fingerprint=same, layers_compared=len(ours),
            layer=layer, field=field, a=in_a, b=in_b, message=message,
        )

    shared = sharing_difference(left.kv_sharing, right.kv_sharing)
    if shared is not None:  # transfer's own rule (exchange/movable.py)
        name, in_a, in_b = shared
        return TransferCompatibility(
            compatible=False, same_fingerprint=same, layers_compared=len(ours), layer=name,
            field="kv_sharing_target", a=in_a or "its own pages", b=in_b or "its own pages",
            message=f"layer {name!r} reads {in_a or 'its own'} pages on A and "
            f"{in_b or 'its own'} on B; a transfer moves a layer's KV with its target's "
            "pages, so both must read the same")
    for name, entry in ours.items():
        other = theirs.get(name)
        if other is None:
            return differs(name, "present", True, False)
        for side, held in (("A", entry), ("B", other)):
            if held.refused is not None:  # transfer's own refusal (exchange/movable.py)
                return TransferCompatibility(
                    compatible=False, same_fingerprint=same, layers_compared=len(ours),
                    layer=name, field="kind", a=entry.refused or "moves",
                    b=other.refused or "moves",
                    message=f"layer {name!r}: {side} keeps it as {held.refused}, which a "
                    "transfer does not move (see docs/transfer.md#what-is-refused)")
        mine, yours = _page_values(entry), _page_values(other)
        for field in LAYOUT_FIELDS:
            if mine[field] != yours[field]:
                return differs(name, field, mine[field], yours[field])
    missing = next((name for name in theirs if name not in ours), None)
    if missing is not None:
        return differs(missing, "present", False, True)
    how = "same fingerprint" if same else "block counts or pool sizes differ"
    return TransferCompatibility(
        compatible=True, same_fingerprint=same, layers_compared=len(ours),
        message=f"transfer-compatible: {len(ours)} transferred layers with the same page "
        f"layout ({how})",
    )
