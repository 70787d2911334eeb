"""Plans and helpers shared by the torch backend tests; this module holds no tests itself."""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import hisparse_plan as hp
from support.golden import load
from support.planning_support import quiet_plan

torch = pytest.importorskip("torch")

SMALL_GOLDEN = "bf16_small_with_full_attention"
MIB = 2**20


plan_of = quiet_plan
"""The torch tests plan through the one quiet helper, planning_support."""


def golden_plan(case: str) -> hp.KVCachePlan:
    return plan_of(load(case)[0])


def small_request() -> dict[str, Any]:
    """The small golden case with its host pool cut to ~38 MiB: every block can be verified."""
    request = copy.deepcopy(load(SMALL_GOLDEN)[0])
    # 130 host blocks of 294912 bytes: one 8192-token request, the null block and a tail.
    request["hisparse"]["host_pool_gib"] = 130 * 294912 / 2**30
    return request


def small_plan() -> hp.KVCachePlan:
    return plan_of(small_request())


def four_sparse_layers(source_head: int, indexer_head: int) -> dict[str, Any]:
    """Four bfloat16 DeepSeek-style layer pairs (a leading sparse layer and its indexer) in
    16-token blocks, with the given head sizes."""
    sparse = {"kind": "mla", "block_size": 16, "head_size": source_head, "dtype": "bfloat16",
              "cache_role": "sparse", "is_index_group_leader": True}
    indexer = {"kind": "mla", "block_size": 16, "head_size": indexer_head, "dtype": "bfloat16",
               "cache_role": "indexer"}
    layers: dict[str, Any] = {}
    for i in range(4):
        layers[f"model.layers.{i}.self_attn.attn"] = sparse
        layers[f"model.layers.{i}.self_attn.indexer.k_cache"] = indexer
    return layers


def exact_fit_plan() -> hp.KVCachePlan:
    """Indexer pages half the source page: the indexer group and every resident and hot group
    fill the device block exactly, so one page less of block stride overlaps the next block."""
    return plan_of({
        "layers": four_sparse_layers(64, 32),
        "model": {"max_model_len": 256, "index_topk": 32},
        "hisparse": {"host_pool_gib": 64 * 8192 / 2**30},
        "device": {"available_bytes": MIB},
    })


def two_tensor_source_plan() -> hp.KVCachePlan:
    """Source layers of two specs with one page size: the host group has two tensors."""
    request = small_request()
    for i in (2, 3):
        name = f"model.layers.{i}.self_attn.attn"
        request["layers"][name] = {**request["layers"][name], "cache_dtype": "variant"}
    return plan_of(request)


QWEN3_NEXT = "regular_qwen3_next_80b_mamba"
PIPELINE = "regular_llama3_70b_pp4_autofit"


def qwen3_next_small_request(layers: int = 8) -> dict[str, Any]:
    """The Qwen3-Next golden case cut to its first `layers` layers (three Mamba, then one
    full attention, repeated), two 544-token attention blocks of context and a 16 MiB pool.
    The shapes stay Qwen3-Next's: each Mamba state page (1,097,728 natural bytes) is padded
    to the 1,114,112-byte attention page, and the Mamba block size is max_model_len."""
    request = copy.deepcopy(load(QWEN3_NEXT)[0])
    max_model_len = 2 * 544
    kept = {}
    for name, spec in request["layers"].items():
        if int(name.split(".")[2]) < layers:
            kept[name] = {**spec, "block_size": max_model_len} if spec["kind"] == "mamba" else spec
    request["layers"] = kept
    request["model"]["max_model_len"] = max_model_len
    request["device"]["available_bytes"] = 16 * MIB
    return request


def padded_attention_request() -> dict[str, Any]:
    """Sliding-window layers of three KV heads beside full-attention layers of two, in a
    layer-outermost layout: the 16,384-byte full-attention page does not divide the 24,576-byte
    sliding-window page, so SPEC 7.3.2 pads it to 24,576 (page_size_padded). About 4 MiB."""
    full = {"kind": "full_attention", "block_size": 16, "num_kv_heads": 2, "head_size": 128,
            "dtype": "bfloat16"}
    window = {**full, "kind": "sliding_window", "num_kv_heads": 3, "sliding_window": 128}
    return {
        "layers": {f"model.layers.{i}.self_attn.attn": full if i % 3 == 2 else window
                   for i in range(6)},
        "model": {"max_model_len": 256},
        "hisparse": None,
        "device": {"available_bytes": 4 * MIB, "kv_cache_layout": "LBNHC"},
    }


def pipeline_small_request() -> dict[str, Any]:
    """The Llama-3-70B pipeline golden case (four stages, auto-fit) cut to eight layers, two
    per stage, with 4 to 7 MiB per stage: 4 MiB device pools."""
    request = copy.deepcopy(load(PIPELINE)[0])
    names = [f"model.layers.{i}.self_attn.attn" for i in range(8)]
    spec = request["layers"][names[0]]
    request["layers"] = {name: spec for name in names}
    request["model"]["max_model_len"] = 4096
    for index, stage in enumerate(request["device"]["pipeline_stages"]):
        stage["layers"] = names[2 * index:2 * index + 2]
        stage["available_bytes"] = (4 + index) * MIB
    return request


def shrunk_plan(case: str, layers: int = 12, max_model_len: int = 512) -> hp.KVCachePlan:
    """A one-stage regular golden case cut to its first `layers` layer indices and a short
    context, on the fewest whole MiB of device memory that plan it (a few MiB to tens)."""
    request = copy.deepcopy(load(case)[0])
    request["layers"] = {name: spec for name, spec in request["layers"].items()
                         if int(name.split(".")[2]) < layers}
    request["model"]["max_model_len"] = min(request["model"]["max_model_len"], max_model_len)
    refusal: hp.PlanError | None = None
    for mib in range(1, 129):
        request["device"]["available_bytes"] = mib * MIB
        try:
            return plan_of(request)
        except hp.CapacityError as error:
            refusal = error
    raise AssertionError(f"{case} cut to {layers} layers does not plan in 128 MiB: {refusal}")


def tampered(plan: hp.KVCachePlan, edit: Callable[[dict[str, Any]], None]) -> hp.KVCachePlan:
    """The plan with its JSON edited and validated back, the static checker never asked."""
    dumped = plan.model_dump(mode="json")
    edit(dumped)
    return hp.KVCachePlan.model_validate(dumped)


def tensor_index(plan: hp.KVCachePlan, first_layer: str) -> int:
    return next(i for i, t in enumerate(plan.tensors) if t.layers[0] == first_layer)


def shared_plan(head_size: int = 36, blocks: int = 256) -> hp.KVCachePlan:
    """A plan with a shared host pool whose source page (4 layers x 16 tokens x head_size
    bfloat16 values, 4608 bytes by default) is not a multiple of 4096, so the pool's
    block_stride (8192) is wider than what its tensors stride per block: a 2 MiB pool."""
    stride = -(-4 * 16 * head_size * 2 // 4096) * 4096
    return plan_of({
        "layers": four_sparse_layers(head_size, 16),
        "model": {"max_model_len": 256, "index_topk": 32},
        "hisparse": {"host_pool_gib": blocks * stride / 2**30, "shared_host_pool": True},
        "device": {"available_bytes": MIB},
    })


def mapped(address: int, nbytes: int) -> bool:
    """Whether any byte of [address, address + nbytes) is mapped in this process."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        low, _, high = line.split()[0].partition("-")
        if int(low, 16) < address + nbytes and address < int(high, 16):
            return True
    return False


class FakeRegistrar:
    """Keeps the registered ranges; fails (or raises) on chosen addresses."""

    def __init__(
        self, *, fail: set[int] | None = None, raise_on: set[int] | None = None,
        fail_unregister: set[int] | None = None, fail_after: int | None = None,
    ) -> None:
        self.fail_after = fail_after
        self.fail = fail or set()
        self.raise_on = raise_on or set()
        self.fail_unregister = fail_unregister or set()
        self.registered: dict[int, int] = {}
        self.base: int | None = None
        """The lowest address ever registered: the host pool's start."""
        self.calls: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    def register(self, address: int, nbytes: int) -> int:
        with self._lock:
            self.calls.append(("register", address))
            self.base = address if self.base is None else min(self.base, address)
            if address in self.raise_on:
                raise RuntimeError("driver went away")
            if address in self.fail or len(self.registered) == self.fail_after:
                return 2
            if any(start < address + nbytes and address < start + size
                   for start, size in self.registered.items()):
                return 712  # cudaErrorHostMemoryAlreadyRegistered
            self.registered[address] = nbytes
            return 0

    def unregister(self, address: int) -> int:
        with self._lock:
            self.calls.append(("unregister", address))
            if address in self.fail_unregister or address not in self.registered:
                return 713
            del self.registered[address]
            return 0

    def describe(self, code: int) -> str:
        return {2: "out of memory", 712: "already registered", 713: "not registered"}[code]


def pattern(seed: int, nbytes: int) -> Any:
    """`nbytes` pseudo-random bytes, the same in every process for one seed."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=generator)


def rank(connection: Any, plan_json: str, name: str) -> None:
    """A second process (a rank) for the shared-pool tests, started with the 'spawn' context:
    allocates `name`, reports what it did, then obeys ("write", seed), ("check", seed),
    ("close", None) until closed. A test may also kill it instead."""
    from hisparse_plan.torch import allocate

    plan = hp.KVCachePlan.model_validate_json(plan_json)
    pools = allocate(plan, device="cpu", pin=False, host_pool_name=name, prefault_threads=1)
    shared = pools.shared
    connection.send(("ready", shared is not None and shared.created, pools.ram_counted))
    while True:
        command, seed = connection.recv()
        host = pools.host
        if command == "write" and host is not None:
            host.copy_(pattern(seed, host.numel()))
            connection.send("written")
        elif command == "check" and host is not None:
            connection.send(bool(torch.equal(host, pattern(seed, host.numel()))))
        elif command == "close":
            pools.release()
            connection.send("closed")
            return


def numa_binding_works() -> bool:
    """Whether this process may bind memory to node 0: mbind needs a NUMA kernel, and some
    container sandboxes (Docker's default seccomp profile without CAP_SYS_NICE) refuse it."""
    from hisparse_plan.torch.hostmem.mapping import HostBuffer
    from hisparse_plan.torch.hostmem.numa import MPOL_PREFERRED, mbind, memory_policy

    if not Path("/sys/devices/system/node/node0").exists():
        return False
    buffer = HostBuffer(4096, huge_pages=False)
    try:
        return mbind(buffer.address, 4096, 0, MPOL_PREFERRED) is None and (
            memory_policy(buffer.address) is not None)
    finally:
        buffer.unmap()


def shared_memory_usable() -> bool:
    """Whether /dev/shm is there to hold shared pools."""
    from hisparse_plan.torch.hostmem.shm import SHM_DIR

    return os.access(SHM_DIR, os.W_OK | os.X_OK)
