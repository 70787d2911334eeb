"""What a device pool's memory holds: its bytes, the bytes left beside the null block, and its
blocks (SPEC 5.8, 5.12, 7.6)."""

from __future__ import annotations


def pool_memory(available_bytes: int, bytes_per_block: int, override: int | None) -> int:
    """The bytes the pool may take: the available bytes, or `override` blocks."""
    return available_bytes if override is None else override * bytes_per_block


def usable_bytes(available_bytes: int, bytes_per_block: int, override: int | None) -> int:
    """The pool's memory less the null block, which is never handed to a request."""
    return pool_memory(available_bytes, bytes_per_block, override) - bytes_per_block


def pool_blocks(available_bytes: int, bytes_per_block: int, override: int | None) -> int:
    """The blocks the pool holds: the override, or available_bytes // bytes_per_block."""
    return available_bytes // bytes_per_block if override is None else override
