"""The pairs and negatives of the connector's end-to-end test, and what each role process
does with one (tests/connectors/test_connector_vllm_e2e.py). A role process is long-lived:
vLLM imports once, and every case gets its own instances (their NIXL agents kept alive, as a
serving engine's are, so a notification still on its way is never dropped).

Plans are tiny (2 layers, a few dozen blocks): what is checked is every byte, not volume."""

from __future__ import annotations

import time
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from support.transfer_support import (
    attention_layers,
    deepseek_request,
    oracle,
    vllm_request,
    write,
    wrong_bytes,
)

TOKENS = 40
REQUEST = "req-0"
ALIVE: list[Any] = []
"""The instances of the case running (and of the one before, dropped when the next starts:
its notifications have landed, since its prefill reported its blocks freed)."""
CONV, HEADS = (16, 8, 8), 4
"""The Mamba layers' conv channel blocks (x | B | C) and temporal heads, full sizes."""


def llama(tp: int, *, block: int = 16, layout: str = "BLHNC", head_size: int = 16,
          dcp: int = 1, heads: int = 4) -> dict[str, Any]:
    """Two attention layers of `heads` KV heads (one rank of `tp`: a head replicated over
    ranks when fewer, as a DCP decode's are), 256 tokens of context."""
    request = vllm_request(attention_layers(2, max(1, heads // tp), block=block,
                                            head_size=head_size),
                           layout=layout, max_model_len=256)
    request["device"]["num_blocks_override"] = 256 // block + 6
    request["scheduler"]["decode_context_parallel_size"] = dcp
    return request


def mamba(tp: int) -> dict[str, Any]:
    """Two Mamba-2-like layers (conv [3, 32 / tp], temporal [4 / tp, 4, 8]) and an attention
    layer of 4 KV heads, one rank of `tp`."""
    state = {"kind": "mamba", "state_shapes": [[3, sum(CONV) // tp], [HEADS // tp, 4, 8]],
             "state_dtypes": ["bfloat16", "float32"], "block_size": 16}
    layers = {f"model.layers.{i}.linear_attn": dict(state) for i in range(2)}
    layers |= attention_layers(1, 4 // tp, block=16, first=2)
    request = vllm_request(layers, layout="BLNHC", available=2**40, max_model_len=256)
    request["device"]["num_blocks_override"] = 24
    return request


MAMBA_FACTS = {"total_kv_heads": 4, "state_groups": list(CONV)}
MAMBA_CUTS = {0: (1, CONV), 1: (0, (HEADS,))}
"""vLLM keeps a conv state (kernel - 1, channels): channels on axis 1; heads on axis 0."""

PAIRS: dict[str, dict[str, Any]] = {
    "llama tp2 -> tp1": {"prefill": llama(2), "decode": llama(1), "prefill_tp": 2},
    "llama tp2 -> tp1, hisparse_plan.torch memory": {
        "prefill": llama(2), "decode": llama(1), "prefill_tp": 2,
        "prefill_memory": "hisparse_plan", "decode_memory": "hisparse_plan"},
    "block 16 -> 64": {"prefill": llama(1, block=16), "decode": llama(1, block=64),
                       "decode_memory": "hisparse_plan"},
    "BLHNC -> LBNHC": {"prefill": llama(1, layout="BLHNC"),
                       "decode": llama(1, layout="LBNHC")},
    # The decode: MultiConnector of this connector and vLLM's HiSparseConnector (its
    # scheduler half: the host import published on finished_recving); the worker halves are
    # this connector's only (HiSparseConnector's pins host memory with CUDA), so the pages
    # its coordinator keeps until its worker acks the host copies stay held.
    "deepseek-v3.2 dense -> hisparse host pool": {
        "prefill": deepseek_request(layers=2),
        "decode": deepseek_request(hisparse=True, layers=2, hisparse_bytes=(2**21, 2**23)),
        "decode_memory": "hisparse_plan", "decode_keeps": "hisparse"},
    "mamba hybrid tp2 -> tp1": {"prefill": mamba(2), "decode": mamba(1), "prefill_tp": 2,
                                "facts": MAMBA_FACTS, "states": MAMBA_CUTS,
                                "prefill_memory": "hisparse_plan",
                                "decode_memory": "hisparse_plan"},
    "tp1 -> tp2 dcp2, interleave 8": {"prefill": llama(1, heads=1),
                                      "decode": llama(2, dcp=2, heads=1),
                                      "decode_tp": 2, "dcp": 2, "interleave": 8,
                                      "facts": {"total_kv_heads": 1}},
}


# ---- the prefill role ------------------------------------------------------------------------

def prefill_case(case: dict[str, Any], pipe: Connection) -> None:
    from hisparse_plan.connectors import peering
    from support import connector_e2e_support as e2e

    if case.get("tamper"):
        pipe.send(tampered(case))
        return
    instance = e2e.start(case["prefill"], tp=case.get("prefill_tp", 1),
                         port=case["prefill_port"], instance=case["name"] + "/prefill",
                         memory=case.get("prefill_memory", "vllm"),
                         lease_s=case.get("lease_s", 30.0), facts=case.get("facts"))
    ALIVE.append(instance)
    pool = instance.scheduler.kv_cache_manager.block_pool
    request = e2e.new_request(REQUEST, TOKENS, {"do_remote_decode": True}, max_tokens=1)
    instance.scheduler.add_request(request)
    if case.get("abort_prefill"):
        instance.scheduler.finish_requests(REQUEST, request_status("FINISHED_ABORTED"))
        instance.step()
        pipe.send(({}, {}, {"free": pool.get_num_free_blocks(), "total": pool.num_gpu_blocks,
                            "held": REQUEST in instance.scheduler.requests}))
        return
    params = None
    while params is None:
        _, engine = instance.step()
        for found in engine.values():
            for output in found.outputs:
                params = output.kv_transfer_params or params
    ticket = params["hisparse_plan_ticket"]
    # The fake forward: seeded KV of the request's tokens through the prefill plan's views.
    side = peering.side([worker.worker_side.payload for worker in instance.workers])
    live: dict[tuple[int, str], Any] = {}
    for rank in range(len(instance.workers)):
        live.update(instance.regions(rank))
    names = sorted(side.instance.facts[0].layers)
    write(side.instance, ticket["block_ids"], live, {n: i for i, n in enumerate(names)},
          {name: (0, 2**40) for name in names}, case.get("states"))
    held_free = pool.get_num_free_blocks()
    pipe.send((params, {key: value.tobytes() for key, value in live.items()}, {}))
    freed_at = None
    stopped = False
    deadline = time.monotonic() + 60
    while freed_at is None and time.monotonic() < deadline:
        if not stopped and pipe.poll():
            stopped = pipe.recv() == "stop"
            # The decode is done: its notification has 5 s to land.
            deadline = min(deadline, time.monotonic() + 5)
        instance.step()
        if REQUEST not in instance.scheduler.requests:
            freed_at = time.time()
        time.sleep(0.002)
    if not stopped:
        pipe.recv()
    pipe.send({"held_free": held_free, "free": pool.get_num_free_blocks(),
               "total": pool.num_gpu_blocks, "freed_at": freed_at,
               "expires_at": ticket["expires_at"]})


def tampered(case: dict[str, Any]) -> dict[str, Any]:
    """A worker handed a tensor unlike its plan (one block short): what registration says."""
    from hisparse_plan.connectors.errors import BindingError
    from support import connector_e2e_support as e2e

    def shorten(tensors: dict[str, Any]) -> dict[str, Any]:
        name = sorted(tensors)[0]
        return {**tensors, name: tensors[name][:-1]}

    try:
        e2e.start(case["prefill"], tp=1, port=case["prefill_port"],
                  instance=case["name"] + "/prefill", tamper=shorten)
    except BindingError as error:
        return {"refused": str(error), "layer": error.layer}
    return {"refused": None}


def request_status(name: str) -> Any:
    import importlib

    return getattr(importlib.import_module("vllm.v1.request").RequestStatus, name)


# ---- the decode role -------------------------------------------------------------------------

def decode_case(case: dict[str, Any], pipe: Connection) -> None:
    from support import connector_e2e_support as e2e

    params, source_bytes = case["params"], case["source"]
    instance = e2e.start(case["decode"], tp=case.get("decode_tp", 1),
                         port=case["decode_port"], instance=case["name"] + "/decode",
                         memory=case.get("decode_memory", "vllm"),
                         interleave=case.get("interleave", 1), facts=case.get("facts"),
                         policy=case.get("policy", "fail"))
    ALIVE.append(instance)
    scheduler = instance.scheduler
    pool = scheduler.kv_cache_manager.block_pool
    live: dict[tuple[int, str], Any] = {}
    for rank in range(len(instance.workers)):
        live.update(instance.regions(rank))
    start = canaries(case, params, instance, live)

    def probe() -> None:  # HiSparse's host import, seen before the workers run each step
        pending = host_imports(scheduler)
        if pending is None or REQUEST not in scheduler.requests:
            return
        states = report.setdefault("host_import", [])
        state = "pending" if REQUEST in pending else "published"
        if not states or states[-1] != state:
            states.append(state)

    instance.on_scheduled = probe
    request = e2e.new_request(REQUEST, TOKENS, dict(params), max_tokens=2)
    scheduler.add_request(request)
    report: dict[str, Any] = {"failed": False, "invalid": 0}
    if case.get("abort_decode") == "before allocation":
        scheduler.finish_requests(REQUEST, request_status("FINISHED_ABORTED"))
    loaded_by = None
    deadline = time.monotonic() + 60
    steps = 0
    # The engine core steps while its scheduler has requests, finished ones not yet told to
    # the connector included (Scheduler.has_requests); not for HiSparse's pending host work
    # here, whose worker half (the acks) does not run on CPU.
    while time.monotonic() < deadline and (
            scheduler.has_unfinished_requests() or scheduler.finished_req_ids
            or REQUEST in scheduler.requests):
        began = time.time()
        _, _ = instance.step()
        steps += 1
        output = instance.last_output
        if output is not None:
            report["failed"] |= REQUEST in (output.failed_recving or set())
            report["invalid"] += len(output.invalid_block_ids or ())
            if REQUEST in (output.finished_recving or set()) and loaded_by is None:
                loaded_by = began
                if REQUEST in scheduler.requests:
                    granted = scheduler.kv_cache_manager.get_block_ids(REQUEST)
                    report["granted"] = {f"group.{k}": list(ids) for k, ids in
                                         enumerate(granted)}
        if case.get("abort_decode") == "during the load" and steps == 1:
            scheduler.finish_requests(REQUEST, request_status("FINISHED_ABORTED"))
        time.sleep(0.001)
    report.update(status=request.status.name, outputs=request.num_output_tokens,
                  computed=request.num_computed_tokens, loaded_by=loaded_by,
                  free=pool.get_num_free_blocks(), total=pool.num_gpu_blocks,
                  gone=REQUEST not in scheduler.requests)
    if start and "granted" in report and not report["failed"]:
        report.update(check_bytes(instance, case, params, source_bytes, start, live,
                                  report["granted"]))
    pipe.send(report)


def host_imports(scheduler: Any) -> Any:
    """HiSparse's pending host imports (request -> tokens) where the decode runs
    HiSparseConnector beside this one, else None: what `finish_host_import` publishes."""
    children = getattr(scheduler.connector, "_connectors", ())
    for child in children:
        coordinator = getattr(getattr(child, "connector_scheduler", None), "coordinator", None)
        if coordinator is not None and hasattr(coordinator, "_pending_imports"):
            return coordinator._pending_imports
    return None


def canaries(case: dict[str, Any], params: dict[str, Any], instance: Any,
             live: dict[Any, Any]) -> dict[Any, Any]:
    """Every byte of the decode's regions random before the pull (the oracle's seed 2), or
    nothing where the pattern is refused (no byte is checked then)."""
    from hisparse_plan.connectors import peering
    from hisparse_plan.connectors.transport import fetch_payloads
    from hisparse_plan.errors import PlanError
    from hisparse_plan.exchange.transfer import compile_transfer
    from hisparse_plan.exchange.transfer.executors.reference import buffers

    if case.get("abort_decode"):
        return {}
    src = peering.side(fetch_payloads(params["hisparse_plan_ticket"]["side_channel"]))
    dst = peering.side([worker.worker_side.payload for worker in instance.workers])
    try:
        pattern = compile_transfer(src.instance, dst.instance)
    except PlanError:
        return {}
    start = buffers(pattern.destination, fill=None, seed=2)
    for key, value in start.items():
        live[key][: value.size] = value
    return start


def check_bytes(instance: Any, case: dict[str, Any], params: dict[str, Any],
                source_bytes: dict[Any, bytes], start: dict[Any, Any],
                live: dict[Any, Any], granted: dict[str, list[int]]) -> dict[str, Any]:
    """Every byte of the decode's regions after the load: against the oracle's geometry (the
    request's cells; every other byte its canary) and the reference executor."""
    from hisparse_plan.connectors import peering
    from hisparse_plan.connectors.transport import fetch_payloads
    from hisparse_plan.exchange.transfer import TransferRequest, compile_transfer, tables
    from hisparse_plan.exchange.transfer.executors.reference import execute

    ticket = params["hisparse_plan_ticket"]
    src = peering.side(fetch_payloads(ticket["side_channel"]))
    dst = peering.side([worker.worker_side.payload for worker in instance.workers])
    known = tables(dst.instance.plans[0])  # vLLM's groups the transfer names
    transfer = TransferRequest(num_tokens=TOKENS, source_blocks=ticket["block_ids"],
                               destination_blocks={k: v for k, v in granted.items()
                                                   if k in known})
    program = compile_transfer(src.instance, dst.instance).instantiate(transfer).program()
    after = {key: live[key][: value.size].copy() for key, value in start.items()}
    if case.get("dcp"):
        from support.dcp_oracle import expected_after

        expected, allowed = expected_after(src.instance, dst.instance, transfer, start,
                                           case["dcp"], case["interleave"])
    else:
        _, _, expected, allowed = oracle(src.instance, dst.instance, transfer, program,
                                         states=case.get("states"))
    source = {key: np.frombuffer(value, dtype=np.uint8).copy()
              for key, value in source_bytes.items()}
    reference = {key: value.copy() for key, value in start.items()}
    execute(program, source, reference)
    return {"wrong_bytes": wrong_bytes(after, expected, allowed),
            "reference_mismatch": sum(int((after[k] != reference[k]).sum()) for k in after),
            "moved_bytes": program.bytes, "checked_bytes": sum(v.size for v in after.values()),
            "changed": sum(int((after[k] != start[k]).sum()) for k in after)}


def factory_facts() -> dict[str, Any]:
    """What vLLM 0.34's KVConnectorFactory makes of the connector's module path."""
    import importlib

    factory = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.factory")
    base = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.v1.base")
    kv_transfer = importlib.import_module("vllm.config.kv_transfer")

    def config(name: str) -> Any:
        return kv_transfer.KVTransferConfig(
            kv_connector=name, kv_connector_module_path="hisparse_plan.connectors.vllm",
            kv_role="kv_both")

    found = factory.KVConnectorFactory.get_connector_class(config("HisparsePlanConnector"))
    try:
        factory.KVConnectorFactory.get_connector_class(config("NoSuchConnector"))
        wrong = None
    except (AttributeError, ValueError) as error:
        wrong = repr(error)
    return {"name": found.__name__, "module": found.__module__,
            "is_v1_connector": issubclass(found, base.KVConnectorBase_V1),
            "supports_hma": base.supports_hma(found),
            "supports_hma_config": factory.KVConnectorFactory.supports_hma_config(
                config("HisparsePlanConnector")),
            "layout": found.get_required_kvcache_layout(None),
            "access": found.kv_cache_access(config("HisparsePlanConnector")).name,
            "wrong_name": wrong}
