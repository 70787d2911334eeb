"""The CLI's parts for SGLang: where an SGLang request comes from, its flags, its summary.
May import every room but the CLI's vLLM part (`cli/vllm/`)."""
