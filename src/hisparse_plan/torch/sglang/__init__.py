"""SGLang plans (`SGLangPlan`) on the torch backend: the pools, SGLang's buffers bound on them,
their verification. May import what torch/ may, torch/'s shared modules; never `torch/vllm/`."""
