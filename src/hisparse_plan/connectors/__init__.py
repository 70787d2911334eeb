"""Connectors: a proved transfer pattern inside a serving engine (docs/connector.md). May
import models, views, checking, exchange, presets, targets, adapters, torch; engines lazily.

The engines (vLLM, NIXL) are imported only inside calls, so importing this package needs
neither. One module per concern,
shared by every engine's connector:

- `protocol`: the per-rank handshake payload and the per-request ticket (untrusted JSON).
- `binding`: the memory an engine hands over, checked against the plan before anything is
  registered (vLLM: the plan of a live `KVCacheConfig`, each layer's tensor against its view).
- `peering`: per pair of instances, the pattern compiled and proved once, cached by the pair
  of fingerprints, cut per pair of ranks and memory types, with each source rank's readers.
- `transport`: the side channel (payloads and tickets, loopback), leases, NIXL's agent.
- `vllm`: `HisparsePlanConnector`, vLLM 0.34's KV connector (imports vLLM).
"""
