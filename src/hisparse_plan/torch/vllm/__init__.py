"""vLLM plans (`KVCachePlan`) on the torch backend: the pools, the layer views bound on them,
their verification. May import what torch/ may, torch/'s shared modules; never `torch/sglang/`."""
