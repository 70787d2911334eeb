"""One vLLM 0.34 instance on CPU for the connector's end-to-end test: the real `Scheduler`
on `to_kv_cache_config(plan)`, the connector's scheduler half made by that scheduler (vLLM's
factory, by module path) and one worker half per tensor-parallel rank, driven each step in
the order vLLM's engine core and `ActiveKVConnector` call them. KV memory is allocated by
vLLM's own `allocate_kv_cache` (vllm/v1/worker/utils.py, on CPU) or by
`hisparse_plan.torch.allocate`. Needs vLLM, torch and nixl-cu12 (the vLLM venv)."""

from __future__ import annotations

import copy
import ctypes
import importlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hisparse_plan.adapters.vllm import to_kv_cache_config
from hisparse_plan.models import KVCachePlan, PlanRequest
from hisparse_plan.targets.vllm import plan as make_plan
from support import vllm_support as vs

MODULE = "hisparse_plan.connectors.vllm"
base = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.v1.base")
factory = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.factory")
sched_mod = importlib.import_module("vllm.v1.core.sched.scheduler")
outputs = importlib.import_module("vllm.v1.outputs")
request_mod = importlib.import_module("vllm.v1.request")
sampling = importlib.import_module("vllm")
structured = importlib.import_module("vllm.v1.structured_output")
config_mod = importlib.import_module("vllm.config")
worker_utils = importlib.import_module("vllm.v1.worker.utils")
kv_cache_utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
kv_utils = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.utils")
torch = importlib.import_module("torch")


def region_view(base_address: int, size: int) -> np.ndarray:
    """A live region's bytes as a writable numpy array (no copy)."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(base_address))


@dataclass
class Instance:
    """A vLLM instance: scheduler, its connector, one worker connector per TP rank."""

    request: PlanRequest
    plan: KVCachePlan
    scheduler: Any
    workers: list[Any]
    tensors: list[dict[str, Any]]
    aggregator: Any
    keep: list[Any] = field(default_factory=list)
    steps: int = 0
    on_scheduled: Any = None
    """Called after each schedule(), before the workers run (a test's probe)."""
    last_output: Any = None
    """The aggregated KVConnectorOutput of the last step (what the scheduler was handed)."""

    @property
    def connector(self) -> Any:
        return self.scheduler.connector

    def regions(self, rank: int) -> dict[tuple[int, str], np.ndarray]:
        side = self.workers[rank].worker_side
        return {key: region_view(*found) for key, found in side.addresses.items()}

    def step(self) -> tuple[Any, Any]:
        """One engine step: schedule, the workers' connector calls (ActiveKVConnector's
        order), their outputs merged by vLLM's own KVOutputAggregator (an id finishes once
        every worker has reported it, in whichever steps they do), update from output."""
        out = self.scheduler.schedule()
        if self.on_scheduled is not None:
            self.on_scheduled()
        meta = out.kv_connector_metadata
        if hasattr(meta, "metadata"):  # MultiConnector's: this connector's is the first child's
            meta = meta.metadata[0]
        per_worker = []
        for worker in self.workers:
            worker.handle_preemptions(meta)
            worker.bind_connector_metadata(meta)
            worker.start_load_kv(None)
            worker.wait_for_save()
            results = worker.get_transfer_results(out.finished_req_ids)
            per_worker.append(outputs.ModelRunnerOutput(
                req_ids=[], kv_connector_output=outputs.KVConnectorOutput(
                    finished_sending=results.finished_sending or None,
                    finished_recving=results.finished_recving or None,
                    failed_recving=set(results.failed_recving),
                    invalid_block_ids=worker.get_block_ids_with_load_errors())))
            worker.clear_connector_metadata()
        connector_output = self.aggregator.aggregate(per_worker).kv_connector_output
        self.last_output = connector_output
        sampled = [[7] if out.num_scheduled_tokens.get(rid) else []
                   for rid in out.num_scheduled_tokens]
        runner = outputs.ModelRunnerOutput(
            req_ids=list(out.num_scheduled_tokens),
            sampled_token_ids=sampled, kv_connector_output=connector_output)
        engine = self.scheduler.update_from_output(out, runner)
        self.steps += 1
        return out, engine


def vllm_config(request: PlanRequest, plan: KVCachePlan, request_path: str, port: int,
                tp: int, instance: str,
                lease_s: float = 30.0, interleave: int = 1,
                facts: dict[str, Any] | None = None) -> Any:
    config = copy.deepcopy(vs.base_config())
    config.kv_transfer_config = config_mod.KVTransferConfig(
        kv_connector="HisparsePlanConnector", kv_connector_module_path=MODULE,
        kv_role="kv_both", kv_buffer_device="cpu",
        kv_connector_extra_config={"plan_request": request_path, "instance_id": instance,
                                   "side_channel_port": port, "lease_s": lease_s,
                                   "facts": facts or {}})
    config.parallel_config.tensor_parallel_size = tp
    workload = plan.workload
    config.parallel_config.decode_context_parallel_size = workload.decode_context_parallel_size
    config.parallel_config.cp_kv_cache_interleave_size = interleave
    config.cache_config.mamba_cache_mode = workload.mamba_cache_mode
    if workload.mamba_cache_mode == "none" and any(
            spec.kind == "mamba" for spec in request.layers.values()):
        config.cache_config.enable_prefix_caching = False  # vLLM's rule for such hybrids
    config.cache_config.block_size = plan.groups[0].spec.block_size
    config.scheduler_config.max_num_batched_tokens = 4096
    config.scheduler_config.max_num_seqs = 8
    config.cache_config.num_gpu_blocks = plan.num_blocks
    # HMA on (vLLM's CPU platform refuses it while validating; the connector supports it).
    config.scheduler_config.disable_hybrid_kv_cache_manager = False
    return config


def allocate(plan: KVCachePlan, live: Any, how: str) -> tuple[dict[str, Any], list[Any]]:
    """Tensors as register_kv_caches receives them: vLLM's allocate_kv_cache on CPU, or
    hisparse_plan.torch.allocate's bound views."""
    if how == "vllm":
        layout = importlib.import_module("vllm.v1.attention.backends.utils")
        kv_layout = layout.KVCacheLayout[plan.device_pool.layout.value]
        tensors = worker_utils.allocate_kv_cache(live, torch.device("cpu"), kv_layout)
        return tensors, []
    import hisparse_plan.torch as hpt

    pools = hpt.allocate(plan, device="cpu", pin=False)
    return pools.views(), [pools]


def start(request_data: dict[str, Any], *, tp: int, port: int, instance: str,
          memory: str = "vllm", lease_s: float = 30.0, interleave: int = 1,
          facts: dict[str, Any] | None = None, policy: str = "fail",
          tamper: Any = None) -> Instance:
    """An instance of `tp` ranks on the plan of `request_data`: its scheduler (vLLM's real one,
    the connector's scheduler half made by it), a worker connector per rank on tensors from
    `memory` ("vllm": allocate_kv_cache; "hisparse_plan": hisparse_plan.torch.allocate),
    every worker's payload on the scheduler's side channel."""
    request = PlanRequest.model_validate(request_data)
    plan = make_plan(request)
    folder = tempfile.mkdtemp(prefix="hisparse_plan_connector_")
    path = os.path.join(folder, "request.json")
    with open(path, "w", encoding="utf-8") as file:
        json.dump(request_data, file)
    live = to_kv_cache_config(plan, tensor_parallel_size=tp)
    config = vllm_config(request, plan, path, port, tp, instance, lease_s, interleave, facts)
    config.kv_transfer_config.kv_load_failure_policy = policy
    worker_config = config
    if request.hisparse is not None:
        config = beside_hisparse(config, request)
    # The engine core's scheduler runs on generate_scheduler_kv_cache_config of the workers'.
    scheduler_config = kv_cache_utils.generate_scheduler_kv_cache_config([live])
    block_size, hash_block_size = kv_cache_utils.resolve_kv_cache_block_sizes(
        scheduler_config, config)
    scheduler = sched_mod.Scheduler(config, scheduler_config,
                                    structured.StructuredOutputManager(config),
                                    block_size=block_size, hash_block_size=hash_block_size)
    workers, tensors, keep = [], [], []
    metadata = {}
    for rank in range(tp):
        worker = factory.KVConnectorFactory.create_connector(
            worker_config, base.KVConnectorRole.WORKER, live)
        worker.worker_side.tp_rank = rank  # one process drives every rank's worker
        found, held = allocate(plan, live, memory)
        if tamper is not None:
            found = tamper(found)
        worker.register_kv_caches(found)
        metadata[(0, rank)] = worker.get_handshake_metadata()
        workers.append(worker)
        tensors.append(found)
        keep.extend(held)
    # The engine core's _set_kv_connector_handshake_metadata.
    scheduler.connector.set_xfer_handshake_metadata_pp_aware(metadata)
    aggregator = kv_utils.KVOutputAggregator.from_connector(workers[0], world_size=tp)
    return Instance(request, plan, scheduler, workers, tensors, aggregator, keep)


def new_request(request_id: str, tokens: int, params: dict[str, Any], max_tokens: int
                ) -> Any:
    found = request_mod.Request(
        request_id, list(range(1, tokens + 1)),
        sampling.SamplingParams(max_tokens=max_tokens, temperature=0.0), None)
    found.kv_transfer_params = params
    return found


def beside_hisparse(config: Any, request: PlanRequest) -> Any:
    """The decode's scheduler config for a HiSparse plan: MultiConnector of this connector
    and vLLM's HiSparseConnector (CONNECTORS.md 1.6). The worker halves stay this
    connector's alone: HiSparseConnector's worker pins and registers host memory with CUDA."""
    hisparse = request.hisparse
    assert hisparse is not None
    found = copy.copy(config)
    attention = importlib.import_module("vllm.config.attention")
    found.attention_config.hisparse_config = attention.HiSparseConfig(
        device_buffer_size=hisparse.device_buffer_size)
    ours = config.kv_transfer_config
    found.kv_transfer_config = config_mod.KVTransferConfig(
        kv_connector="MultiConnector", kv_role="kv_both", kv_buffer_device="cpu",
        kv_load_failure_policy=ours.kv_load_failure_policy,
        kv_connector_extra_config={"connectors": [
            {"kv_connector": ours.kv_connector,
             "kv_connector_module_path": ours.kv_connector_module_path,
             "kv_role": "kv_both", "kv_buffer_device": "cpu",
             "kv_connector_extra_config": ours.kv_connector_extra_config},
            {"kv_connector": "HiSparseConnector", "kv_role": "kv_both",
             "kv_connector_extra_config": {"host_pool_gib": hisparse.host_pool_gib}}]})
    return found
