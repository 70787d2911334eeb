"""Element types a cache can hold, by name, and their sizes in bytes."""

from __future__ import annotations

from typing import Final, Literal

DType = Literal[
    "uint8", "int8", "float8_e4m3fn", "float8_e5m2", "bfloat16", "float16", "float32"
]

DTYPE_SIZE: Final[dict[str, int]] = {
    "uint8": 1,
    "int8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
}


def dtype_size(dtype: DType) -> int:
    return DTYPE_SIZE[dtype]
