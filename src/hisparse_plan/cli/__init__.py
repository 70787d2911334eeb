"""The `hisparse-plan` command (presentation only: it calls the public API).
May import every other room; an engine's part (`vllm/`, `sglang/`) never the other's."""
