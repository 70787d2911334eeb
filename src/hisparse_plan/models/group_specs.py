"""What one block of a cache group holds (see docs/planning-rules.md#pages,
#resident-and-hot-packs, docs/plan-contract.md)."""

from __future__ import annotations

from operator import attrgetter
from typing import Annotated, ClassVar, Literal

from pydantic import Field, Tag, ValidatorFunctionWrapHandler, field_validator

from hisparse_plan.models.base import (
    BY_KIND,
    ByteCount,
    LayerName,
    Model,
    PositiveInt,
    freeze,
)
from hisparse_plan.models.derived import store_derived
from hisparse_plan.models.layer_specs import LAYER_SPEC_CLASSES, LayerSpec, TaggedLayerSpec

_BLOCK_SIZE = attrgetter("block_size")
_PAGE_SIZE = attrgetter("page_size_bytes")


class UniformTypeSpec(Model):
    """Several layer specs of one family (see docs/planning-rules.md#families) sharing one block
    table: a block holds one
    page of every member."""

    kind: Literal["uniform_type"] = "uniform_type"
    block_size: PositiveInt = Field(description="Tokens one block covers, for every member.")
    page_size_bytes: ByteCount = Field(
        default=0, description="Derived: the sum of the members' pages. Checked if given."
    )
    specs: Annotated[dict[LayerName, LayerSpec], Field(min_length=1)] = Field(
        description="Layer name -> that layer's own spec."
    )

    @field_validator("specs", mode="wrap")
    @classmethod
    def _built_members(cls, value: object, handler: ValidatorFunctionWrapHandler) -> object:
        """Members that are built specs are taken as they are, as pydantic takes any built
        model; only other input (JSON) goes through the kind dispatch."""
        if (
            isinstance(value, dict)
            and value
            and LAYER_SPEC_CLASSES.issuperset(map(type, value.values()))
            and set(map(type, value)) == {str}
            and "" not in value
        ):
            return value
        return handler(value)

    def model_post_init(self, context: object, /) -> None:
        if set(map(_BLOCK_SIZE, self.specs.values())) != {self.block_size}:
            name, spec = next(
                (n, s) for n, s in self.specs.items() if s.block_size != self.block_size
            )
            raise ValueError(
                f"specs[{name!r}].block_size: expected the group's {self.block_size}, "
                f"got {spec.block_size}"
            )
        freeze(self, "specs", self.specs)
        page = sum(map(_PAGE_SIZE, self.specs.values()))
        store_derived(self, "page_size_bytes", page, "sum of the members' pages")


class HisparseResidentSpec(Model):
    """GPU pages that keep a request's most recent source rows until they reach host memory."""

    kind: Literal["hisparse_resident"] = "hisparse_resident"
    block_size: PositiveInt = Field(description="The source layers' block size.")
    page_size_bytes: PositiveInt = Field(description="The pack's source page.")

    align: ClassVar[int] = 1
    """Byte rows: no block-stride alignment."""


class HisparseHotSpec(Model):
    """A request's fixed GPU buffer for the top-k rows its indexer selected."""

    kind: Literal["hisparse_hot"] = "hisparse_hot"
    block_size: PositiveInt = Field(description="The source layers' block size.")
    page_size_bytes: PositiveInt = Field(description="The pack's source page.")
    blocks_per_request: PositiveInt = Field(
        description="ceil(device_buffer_size / block_size): the hot buffer of one request."
    )

    align: ClassVar[int] = 1
    """Byte rows: no block-stride alignment."""


GroupSpec = Annotated[
    TaggedLayerSpec
    | Annotated[UniformTypeSpec, Tag("uniform_type")]
    | Annotated[HisparseResidentSpec, Tag("hisparse_resident")]
    | Annotated[HisparseHotSpec, Tag("hisparse_hot")],
    BY_KIND,
]

DerivedLayerSpec = HisparseResidentSpec | HisparseHotSpec
"""The specs of the layers HiSparse derives from the source layers."""
