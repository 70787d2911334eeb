"""SGLang's server modes, a module each (speculative drafts, pipeline ranks, radix cache off, DCP,
DP attention): rules the stages call. May import the target's top-level rules, never a stage."""
