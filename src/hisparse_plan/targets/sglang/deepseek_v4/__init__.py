"""DeepSeek-V4 in SGLang: its pools' model, defaults, sizing, pipeline ranks and HiSparse, rules
the stages call for a V4 request. May import the target's top-level rules and modes/."""
