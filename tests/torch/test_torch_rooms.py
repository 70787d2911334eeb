"""The torch backend's shape (docs/architecture.md): `torch/hostmem/` is host memory for a number
of bytes and knows no plan; each engine's plans are bound and verified in its own part
(`torch/vllm/`, `torch/sglang/`), and only those parts and the entry points name an engine;
`allocate`'s keywords are listed once."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from support.import_graph import PACKAGE, import_graph, modules

pytest.importorskip("torch")  # the backend is an extra: skip without it

from hisparse_plan.torch.allocation import AllocateOptions, Arguments
from hisparse_plan.torch.errors import HostMemoryError
from hisparse_plan.torch.hostmem import (
    HostBuffer,
    HostMemory,
    HostOptions,
    plan_chunks,
    private,
    register,
    share,
)
from hisparse_plan.torch.hostmem import shm as shm_module
from hisparse_plan.torch.hostmem.mapping import OS_PAGE
from support.torch_support import FakeRegistrar, mapped

TORCH = f"{PACKAGE}.torch"
HOSTMEM = f"{TORCH}.hostmem"
ENGINE_PARTS = ("vllm", "sglang")
ENTRY_POINTS = frozenset({f"{TORCH}.engines", TORCH})
"""The modules outside the engines' parts that hand a plan to its engine, by plan type."""


def torch_modules() -> dict[str, Path]:
    return {name: path for name, path in modules().items()
            if name == TORCH or name.startswith(f"{TORCH}.")}


def test_hostmem_imports_nothing_of_the_package_but_itself_and_the_errors() -> None:
    graph = import_graph()
    allowed = {f"{TORCH}.errors"}
    outside = {f"{name} -> {edge}" for name in graph
               if name == HOSTMEM or name.startswith(f"{HOSTMEM}.")
               for edge in graph[name]
               if not (edge == HOSTMEM or edge.startswith(f"{HOSTMEM}.") or edge in allowed)}
    assert outside == set()


def test_only_the_engines_parts_and_the_entry_points_name_an_engine() -> None:
    named = []
    for name, path in sorted(torch_modules().items()):
        part = name.removeprefix(f"{TORCH}.").split(".")[0]
        if part in ENGINE_PARTS or name in ENTRY_POINTS:
            continue
        text = path.read_text(encoding="utf-8").lower()
        named += [f"{name} names {engine}" for engine in ENGINE_PARTS if engine in text]
    assert named == []


def test_the_engines_parts_do_not_import_each_other() -> None:
    graph = import_graph()
    crossing = [f"{name} -> {edge}" for name in graph for edge in graph[name]
                for mine, other in (ENGINE_PARTS, ENGINE_PARTS[::-1])
                if name.startswith(f"{TORCH}.{mine}") and edge.startswith(f"{TORCH}.{other}")]
    assert crossing == []


def test_allocate_keywords_and_their_defaults_are_one_list() -> None:
    keywords = list(AllocateOptions.__annotations__)
    assert keywords == [field.name for field in dataclasses.fields(Arguments)]
    # The public keywords, as allocate has always taken them:
    assert keywords == ["device", "pin", "register_chunk_bytes", "prefault_threads", "huge_pages",
                        "registrar", "host_pool_name", "numa_node", "progress", "stage",
                        "lock_timeout_s"]


def _options(threads: int = 2) -> HostOptions:
    return HostOptions(huge_pages=False, numa_node=None, gpu=None, threads=threads,
                       progress=None, lock_timeout_s=5.0)


def test_a_private_pool_of_bytes_lives_and_dies_without_a_plan() -> None:
    nbytes = 5 * OS_PAGE + 100
    how = _options()
    state = private(HostBuffer(nbytes, huge_pages=False), how)
    buffer = state.buffer
    assert isinstance(buffer, HostBuffer)
    address = buffer.address
    assert (state.ram_counted, state.shared) == (nbytes, None)
    registrar = FakeRegistrar()
    chunks = plan_chunks(nbytes, [], chunk_bytes=2 * OS_PAGE, os_page=OS_PAGE)
    register(state, registrar, chunks, how)
    # Every byte in one chunk, each chunk registered at its own start.
    assert sorted(registrar.registered.items()) == [
        (address + start, min(2 * OS_PAGE, nbytes - start)) for start in range(0, nbytes,
                                                                               2 * OS_PAGE)]
    del buffer
    state.close()
    assert registrar.registered == {}
    assert state.buffer is None
    assert not mapped(address, nbytes)


def test_a_shared_pool_of_bytes_is_created_counted_and_removed_without_a_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shm_module, "SHM_DIR", tmp_path)
    nbytes = 3 * OS_PAGE
    state, devices = share("rooms", nbytes, _options(), in_ram=0,
                           memory=lambda: HostMemory(2**40, "test"),
                           allocate_devices=lambda: "the device pools")
    assert devices == "the device pools"
    shared = state.shared
    assert shared is not None
    assert (shared.created, shared.nbytes, state.ram_counted) == (True, nbytes, nbytes)
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "hisparse_plan-rooms.lock", "hisparse_plan-rooms.pool"]
    state.close()
    assert list(tmp_path.iterdir()) == []


def test_a_shared_pool_is_held_to_the_ram_figure_it_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shm_module, "SHM_DIR", tmp_path)
    scarce = HostMemory(OS_PAGE, "test")
    with pytest.raises(HostMemoryError, match=r"^the shared host pool 'scarce' \(created here\)"):
        share("scarce", 4 * OS_PAGE, _options(), in_ram=0, memory=lambda: scarce,
              allocate_devices=lambda: None)
    assert list(tmp_path.iterdir()) == []

