"""HiSparse in SGLang beside the KV pools: its metadata tensors and its speculative swap, rules
the stages call. May import the target's top-level rules, never a stage."""
