"""The CLI's parts for vLLM: where a vLLM request comes from, its flags, its summaries.
May import every room but the CLI's SGLang part (`cli/sglang/`)."""
