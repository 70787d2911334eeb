"""`HisparsePlanConnector`: vLLM 0.34's KV connector over proved transfer patterns. Importing
this module imports vLLM (it subclasses `KVConnectorBase_V1` and `SupportsHMA`).

Loaded by module path::

    --kv-transfer-config '{"kv_connector": "HisparsePlanConnector",
      "kv_connector_module_path": "hisparse_plan.connectors.vllm", "kv_role": "kv_both"}'

The scheduler half is `SchedulerSide`, the worker half `WorkerSide` (no vLLM in either);
this class only routes vLLM's calls to them (docs/connector.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore[import-not-found, unused-ignore]
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)

from hisparse_plan.connectors.errors import ConnectorError
from hisparse_plan.connectors.protocol import HandshakePayload
from hisparse_plan.connectors.transport import SideChannel
from hisparse_plan.connectors.vllm.scheduler import SchedulerSide, StepMeta
from hisparse_plan.connectors.vllm.settings import live_plan, settings_of
from hisparse_plan.connectors.vllm.worker import WorkerSide


@dataclass
class PlanHandshake(KVConnectorHandshakeMetadata):  # type: ignore[misc, unused-ignore]
    """One worker's handshake payload, as JSON text."""

    payload: str


class PlanMeta(KVConnectorMetadata):  # type: ignore[misc, unused-ignore]
    """One step's loads and holds for the workers."""

    def __init__(self, step: StepMeta) -> None:
        self.step = step


class HisparsePlanConnector(KVConnectorBase_V1, SupportsHMA):  # type: ignore[misc, unused-ignore]
    """Pull by default: the decode READs through the proved pattern's lanes."""

    def __init__(self, vllm_config: Any, role: Any,  # noqa: ANN401
                 kv_cache_config: Any = None) -> None:  # noqa: ANN401
        super().__init__(vllm_config, role, kv_cache_config)
        self.settings = settings_of(vllm_config)
        self.plan = live_plan(vllm_config, kv_cache_config, self.settings)
        self.channel: SideChannel | None = None
        self.payloads: list[str] = []
        self.scheduler_side: SchedulerSide | None = None
        self.worker_side: WorkerSide | None = None
        if role == KVConnectorRole.SCHEDULER:
            self.scheduler_side = SchedulerSide(self.plan, self.settings)
        else:
            parallel = vllm_config.parallel_config
            self.worker_side = WorkerSide(
                self.plan, self.settings, pp_rank=_rank("pp"), tp_rank=_rank("tp"),
                pp_size=parallel.pipeline_parallel_size,
                tp_size=parallel.tensor_parallel_size,
                dcp_size=parallel.decode_context_parallel_size,
                cp_kv_cache_interleave_size=getattr(parallel, "cp_kv_cache_interleave_size", 1))

    # -- class-level answers -----------------------------------------------------------
    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> str | None:  # noqa: ANN401
        return None  # any layout: the pattern reads each side's own strides

    @classmethod
    def kv_cache_access(cls, kv_transfer_config: Any) -> Any:  # noqa: ANN401
        from vllm.config.kv_transfer import (  # type: ignore[import-not-found, unused-ignore]
            KVCacheAccess,
        )

        return KVCacheAccess.REGISTERS

    # -- scheduler side ----------------------------------------------------------------
    def _sched(self) -> SchedulerSide:
        if self.scheduler_side is None:
            raise ConnectorError("a scheduler call on a worker connector; expected vLLM to "
                                 "call it on the scheduler's", field="role")
        return self.scheduler_side

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int  # noqa: ANN401
                                   ) -> tuple[int | None, bool]:
        return self._sched().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any,  # noqa: ANN401
                                 num_external_tokens: int) -> None:
        self._sched().update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> Any:  # noqa: ANN401
        return PlanMeta(self._sched().build_meta())

    def request_finished(self, request: Any, block_ids: Any  # noqa: ANN401
                         ) -> tuple[bool, dict[str, Any] | None]:
        return self._sched().request_finished(request, (block_ids,))

    def request_finished_all_groups(self, request: Any, block_ids: Any  # noqa: ANN401
                                    ) -> tuple[bool, dict[str, Any] | None]:
        return self._sched().request_finished(request, block_ids)

    def get_loaded_kv_cache_group_ids(self, request: Any) -> tuple[int, ...]:  # noqa: ANN401
        return self._sched().group_ids

    def set_xfer_handshake_metadata_pp_aware(self, metadata: dict[Any, Any]) -> None:
        """Every worker's payload, served on the side channel (checked as a peer would)."""
        texts = [value.payload for _, value in sorted(metadata.items())]
        for text in texts:
            HandshakePayload.model_validate_json(text)
        self.payloads = texts
        if self.channel is None:
            self.channel = SideChannel(self.settings.side_channel_host,
                                       self.settings.side_channel_port, lambda: self.payloads)

    def set_xfer_handshake_metadata(self, metadata: dict[int, Any]) -> None:
        self.set_xfer_handshake_metadata_pp_aware({(0, k): v for k, v in metadata.items()})

    # -- worker side -------------------------------------------------------------------
    def _work(self) -> WorkerSide:
        if self.worker_side is None:
            raise ConnectorError("a worker call on the scheduler connector; expected vLLM to "
                                 "call it on a worker's", field="role")
        return self.worker_side

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        self._work().register(kv_caches)

    def get_handshake_metadata(self) -> Any:  # noqa: ANN401
        payload = self._work().payload
        return None if payload is None else PlanHandshake(payload.model_dump_json())

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:  # noqa: ANN401
        meta = self._get_connector_metadata()
        self._work().start(meta.step)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,  # noqa: ANN401
                      **kwargs: Any) -> None:  # noqa: ANN401
        return None

    def wait_for_save(self) -> None:
        return None

    def get_transfer_results(self, finished_req_ids: set[str]) -> Any:  # noqa: ANN401
        sending, recving, failing = self._work().poll()
        return KVConnectorTransferResults(finished_sending=sending,
                                          finished_recving=recving | failing,
                                          failed_recving=failing)

    def get_finished(self, finished_req_ids: set[str]
                     ) -> tuple[set[str] | None, set[str] | None]:
        results = self.get_transfer_results(finished_req_ids)
        return results.finished_sending or None, results.finished_recving or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._work().take_invalid()

    def shutdown(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None


def _rank(kind: str) -> int:
    """This worker's pipeline or tensor-parallel rank (0 where vLLM's groups are not set up,
    as on a CPU test driving one worker per rank itself)."""
    from vllm.distributed import parallel_state  # type: ignore[import-not-found, unused-ignore]

    try:
        group = parallel_state.get_pp_group() if kind == "pp" else parallel_state.get_tp_group()
    except AssertionError:
        return 0
    return int(group.rank_in_group)
