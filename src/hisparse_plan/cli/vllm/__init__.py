"""The CLI's parts for vLLM: where a vLLM request comes from, its flags, its summaries."""
