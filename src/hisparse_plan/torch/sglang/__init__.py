"""SGLang plans (`SGLangPlan`) on the torch backend: the pools, SGLang's buffers bound on them,
and their verification."""
