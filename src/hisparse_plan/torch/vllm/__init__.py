"""vLLM plans (`KVCachePlan`) on the torch backend: the pools, the layer views bound on them,
and their verification."""
