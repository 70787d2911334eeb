"""Split: `meta_check` is now `hisparse_plan.torch.engines` (and `hisparse_plan.torch`), a vLLM
plan's check `hisparse_plan.torch.vllm.meta`, an SGLang plan's `hisparse_plan.torch.sglang.meta`.
This old path re-exports what it held, with a DeprecationWarning."""

from hisparse_plan._moved import deprecated_path
from hisparse_plan.torch.engines import meta_check
from hisparse_plan.torch.sglang.meta import SGLangMetaReport, meta_check_sglang
from hisparse_plan.torch.vllm.meta import MetaReport

deprecated_path(__name__, "hisparse_plan.torch.engines, hisparse_plan.torch.vllm.meta and "
                "hisparse_plan.torch.sglang.meta")

__all__ = ["MetaReport", "SGLangMetaReport", "meta_check", "meta_check_sglang"]
