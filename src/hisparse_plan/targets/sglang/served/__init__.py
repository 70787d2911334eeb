"""What SGLang serves of a model: its registry's architectures, its reading of config.json,
Llama-4's and multimodal models' rules. May import the target's top-level rules and modes/."""
