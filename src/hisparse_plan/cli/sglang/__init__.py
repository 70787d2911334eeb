"""The CLI's parts for SGLang: where an SGLang request comes from, its flags, its summary."""
