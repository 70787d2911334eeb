"""The config reader against vLLM 0.34 over transformers' own enumeration of decoder language
models. Needs vLLM (run it in the vLLM venv, with this checkout's sources first):

    HISPARSE_TRANSFORMERS_RESULTS=/tmp/tf-sweep.jsonl PYTHONPATH=src:TIMM_DIR \\
        /work/vllm-venv/bin/python references/vllm_transformers_sweep.py [NAME ...]

What is swept (`every_name`):
- `type:T` for each model_type T of transformers' causal-LM enumeration
  (`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`) but encoder-decoder classes (`is_encoder_decoder`) and
  encoders that also decode (their type is in the masked-LM enumeration: BERT, RoBERTa, ...):
  the config class's defaults at small size (`vllm_family_sweep.small_config`), with the causal
  LM class as its `architectures`, and the checkpoint fields vLLM's code needs where the family
  sweep names them (`CHECKPOINT_FIELDS`);
- `arch:A` for each architecture vLLM's registry names its Transformers backend for that no
  such causal LM class is (the multimodal ones), its config made as the registry sweep makes
  one (`registry_config`);
- `checkpoint:N` for the published config.json files of CHECKPOINTS (the architectures that the
  registry does not name, which vLLM serves through its Transformers backend or refuses);
- `fixture:N` for each tests/hf_configs fixture whose architectures vLLM's registry names none
  of.

Each config is built as `--registry-build` builds one (`vllm_family_sweep.build_one`: vLLM's
own model resolution, then its class on the meta device) and read by the config reader without
transformers (the stored config is transformers' whole `to_dict` already). The reader's answer
is compared with vLLM's: the cache layers (names, kinds, heads, sizes, windows, MLA rows,
states, sharing) and the model class vLLM resolves (`presets.resolution.vllm_model_class`).
Where vLLM refuses the config (its registry refuses the architecture, or its class refuses the
config while built), the reader must refuse too. The results go to HISPARSE_TRANSFORMERS_RESULTS
(one JSON line a name; the last counts); the table to docs/vllm-transformers-sweep.md and
tests/vllm_transformers_sweep.json (tests/presets/test_vllm_transformers_sweep.py pins it without
vLLM). `--table` rewrites both from the results without building.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Final

import vllm_family_sweep as sweep

REPO: Final = Path(__file__).resolve().parent.parent
RESULTS: Final = Path(os.environ.get("HISPARSE_TRANSFORMERS_RESULTS")
                      or Path(tempfile.gettempdir()) / "hisparse-vllm-transformers.jsonl")
TABLE_DOC: Final = REPO / "docs" / "vllm-transformers-sweep.md"
TABLE_PIN: Final = REPO / "tests" / "vllm_transformers_sweep.json"
CHECKPOINTS: Final[dict[str, tuple[str, dict[str, Any]]]] = {
    "dots.llm1.inst": ("rednote-hilab/dots.llm1.inst config.json", {
        "architectures": ["Dots1ForCausalLM"], "model_type": "dots1",
        "attention_bias": False, "attention_dropout": 0.0, "first_k_dense_replace": 1,
        "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
        "initializer_range": 0.02, "intermediate_size": 10944, "max_position_embeddings": 32768,
        "max_window_layers": 62, "moe_intermediate_size": 1408, "moe_layer_freq": 1,
        "n_routed_experts": 128, "n_shared_experts": 2, "norm_topk_prob": True,
        "num_attention_heads": 32, "num_experts_per_tok": 6, "num_hidden_layers": 62,
        "num_key_value_heads": 32, "rms_norm_eps": 1e-05, "rope_scaling": None,
        "rope_theta": 10000000, "routed_scaling_factor": 2.5, "sliding_window": None,
        "scoring_func": "noaux_tc", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "use_cache": True, "use_sliding_window": False, "vocab_size": 152064}),
    "persimmon-8b-base": ("adept/persimmon-8b-base config.json", {
        "architectures": ["PersimmonForCausalLM"], "model_type": "persimmon",
        "hidden_act": "relu2", "hidden_size": 4096, "initializer_range": 0.02,
        "intermediate_size": 16384, "layer_norm_eps": 1e-05, "max_position_embeddings": 16384,
        "num_attention_heads": 64, "num_hidden_layers": 36, "partial_rotary_factor": 0.5,
        "qk_layernorm": True, "rope_scaling": None, "rope_theta": 25000.0,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
        "vocab_size": 262144}),
}
"""Published checkpoints' config.json, as their Hub repositories ship them."""


def _mappings() -> tuple[Any, Any]:
    auto = importlib.import_module("transformers.models.auto.modeling_auto")
    configs = importlib.import_module("transformers.models.auto.configuration_auto")
    return auto, configs


def decoder_types() -> list[str]:
    """transformers' causal-LM model_types that are decoder language models."""
    auto, configs = _mappings()
    masked = set(auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES)
    found = []
    for model_type in sorted(auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        if model_type in masked:
            continue
        try:
            if configs.CONFIG_MAPPING[model_type]().is_encoder_decoder:
                continue
        except Exception:
            pass
        found.append(model_type)
    return found


def registry_names() -> set[str]:
    from vllm.model_executor.models import registry  # type: ignore[import-not-found, unused-ignore]

    return set(registry.ModelRegistry.models)


def fixtures_outside_registry() -> list[str]:
    known = registry_names()
    found = []
    for folder in sorted(sweep.CONFIGS.iterdir()):
        names = json.loads((folder / "config.json").read_text()).get("architectures") or []
        if not any(name in known for name in names):
            found.append(folder.name)
    return found


def backend_named_elsewhere() -> list[str]:
    """The architectures vLLM's registry names its Transformers backend for that no swept
    model_type's causal LM class is (the multimodal ones: Aria, Emu3, ...)."""
    from vllm.model_executor.models import registry  # type: ignore[import-not-found, unused-ignore]

    auto, _ = _mappings()
    covered = set(auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    return sorted(set(registry._TRANSFORMERS_SUPPORTED_MODELS) - covered)


def every_name() -> list[str]:
    return ([f"type:{t}" for t in decoder_types()]
            + [f"arch:{name}" for name in backend_named_elsewhere()]
            + [f"checkpoint:{name}" for name in CHECKPOINTS]
            + [f"fixture:{name}" for name in fixtures_outside_registry()])


def sweep_config(name: str) -> tuple[dict[str, Any] | None, str]:
    """The config of one swept name and where it came from (None and why where there is none)."""
    kind, _, key = name.partition(":")
    if kind == "checkpoint":
        source, config = CHECKPOINTS[key]
        return dict(config), source
    if kind == "fixture":
        return json.loads((sweep.CONFIGS / key / "config.json").read_text()), f"fixture {key}"
    if kind == "arch":
        return sweep.registry_config(key)  # as the registry sweep makes one
    auto, configs = _mappings()
    arch = auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[key]
    if sweep.MODEL_TYPES.get(arch, key) != key:
        return None, (f"{arch}'s checkpoints carry {sweep.MODEL_TYPES[arch]} configs (the "
                      "registry sweep's MODEL_TYPES), swept as that type")
    if arch in sweep.FIXTURE_FIRST and (fixture := sweep.fixture_naming(arch)) is not None:
        return fixture  # as the registry sweep reads it (its FIXTURE_FIRST says why)
    try:
        config = sweep.small_config(configs.CONFIG_MAPPING[key]).to_dict()  # type: ignore[attr-defined]
    except Exception as error:  # the class fails to import or to build its defaults
        return None, f"transformers' {key} config: {type(error).__name__}: {error}"[:300]
    config = {**config, "model_type": key, "architectures": [arch]}
    if arch in sweep.CHECKPOINT_FIELDS:
        checkpoint, fields = sweep.CHECKPOINT_FIELDS[arch]
        return (sweep.with_fields(config, fields),
                f"transformers {key}, {', '.join(sweep.field_names(fields))} {checkpoint}")
    return config, f"transformers {key}"


HARNESS_FAILURES: Final = (
    "no answer in", "No module named", "not supported on CPU", "Can't load image processor",
    "Can't load feature extractor", "no valid sparse MLA backend",
)
"""Failures of the harness rather than of vLLM's resolution or model code: a timeout, a
package missing here, a kernel vLLM's CPU build lacks (sparse MLA), a multimodal processor's
(image processor, feature extractor) files a config.json alone does not carry."""
DEFAULTS_INCOMPLETE: Final = ("first_k_dense_replace", "padded_vocab_size", "scale_embedding")
"""Fields every checkpoint of the model carries but transformers' class defaults leave out,
which vLLM's model code reads (MoE layout, vocabulary padding, an audio encoder's embedding
scale: no cache depends on them)."""


def seed_from_registry() -> int:
    """The registry sweep's meta builds (tests/vllm_registry.json) of the same configs, reused:
    a `type:T` whose architecture vLLM's registry names was built there from transformers'
    `T` defaults exactly as here (`build_one`), so only what vLLM built is copied, and only
    where the registry sweep read the same model_type. Returns how many were seeded."""
    auto, _ = _mappings()
    registry = json.loads(sweep.TABLE_PIN.read_text())
    done = {json.loads(line)["name"] for line in RESULTS.read_text().splitlines()} if (
        RESULTS.exists()) else set()
    seeded = 0
    with RESULTS.open("a") as out:
        for model_type in decoder_types():
            name = f"type:{model_type}"
            entry = registry.get(auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type], {})
            source = str(entry.get("source", ""))
            if name in done or "layers" not in entry or not (
                    source == f"transformers {model_type}"
                    or source.startswith(f"transformers {model_type},")):
                continue
            out.write(json.dumps({"name": name, **entry, "seeded": "registry sweep"}) + "\n")
            seeded += 1
    return seeded


WITHOUT_EXPERTS: Final = frozenset({"dots1"})
"""model_types whose config class defaults to an MoE model without its expert count
(Dots1Config's `n_routed_experts` is None): transformers' own model cannot be built from them,
so neither can vLLM's backend; the published checkpoint is swept (`CHECKPOINTS`)."""


def classified(result: dict[str, Any]) -> str:
    """A failed build's status by what failed: the defaults, the harness, or vLLM refusing."""
    if result["status"] not in ("vllm_cannot_build", "vllm_refuses", "refused_by_both",
                                "reader_plans", "defaults_incomplete"):
        return str(result["status"])
    why = str(result.get("why", ""))
    if any(text in why for text in DEFAULTS_INCOMPLETE) or (
            result["name"].removeprefix("type:") in WITHOUT_EXPERTS):
        return "defaults_incomplete"
    if any(text in why for text in HARNESS_FAILURES):
        return "vllm_cannot_build"
    return "vllm_refuses"


def sweep_one(name: str) -> dict[str, Any]:
    config, source = sweep_config(name)
    result = sweep.build_one(name, config, source)
    result["status"] = classified(result)
    try:
        return {**result, **verdict(result)}
    except Exception as error:  # the reader's verdict is taken again when the table is written
        return {**result, "verdict_error": f"{type(error).__name__}: {error}"[:300]}


def verdict(entry: dict[str, Any]) -> dict[str, Any]:
    """The reader's answer against vLLM's for one entry (built or refused by vLLM)."""
    from hisparse_plan.errors import PlanError
    from hisparse_plan.presets import Settings, build_request
    from hisparse_plan.presets.config_file import model_from_config
    from hisparse_plan.presets.resolution import vllm_model_class

    # transformers' defaults are stored whole (to_dict); a published config.json is read as
    # the reader reads one, through transformers' class.
    published = not entry["name"].startswith(("type:", "arch:"))
    if entry["status"] in ("vllm_refuses", "refused_by_both", "reader_plans"):
        try:
            # Any context length: a refusal must be about the model, not the length chosen.
            build_request(model_from_config(entry["config"], origin=entry["name"],
                                            use_transformers=published, vllm_serves=True),
                          Settings(max_model_len=4096, allow_long_context=True))
        except PlanError as error:
            return {"status": "refused_by_both", "reader_why": f"{error.field}: {error}"[:300]}
        return {"status": "reader_plans"}
    if "layers" not in entry:
        return {}
    found = sweep.reader_verdict(entry, use_transformers=published)
    if not entry["layers"] and not entry.get("shared"):
        # vLLM built no cache layer (an encoder's attention): the reader must plan none.
        return ({"status": "no_cache_both", "reader_why": found["why"]}
                if found["status"] == "reader_refuses" else found)
    if found["status"] == "same":
        ours = vllm_model_class(entry["config"])
        if ours != entry["model_class"]:
            return {"status": "differ",
                    "why": f"model class: reader {ours}, vLLM {entry['model_class']}"}
    return found


STATUSES: Final = {
    "same": "equal", "differ": "DIFFERS", "reader_refuses": "REFUSES (vLLM builds)",
    "refused_by_both": "refuses", "reader_plans": "PLANS (vLLM refuses)",
    "no_cache_both": "refuses (no cache)",
    "unmodelled_kind": "not compared",
}


def write_table() -> None:
    """The doc and the pin from RESULTS, the reader's verdict taken anew."""
    results: dict[str, dict[str, Any]] = {}
    for line in RESULTS.read_text().splitlines():
        entry = json.loads(line)
        entry["status"] = classified(entry)
        entry.pop("reader_why", None)
        if "layers" in entry:
            entry.pop("why", None)
        entry.update(verdict(entry))
        results[entry["name"]] = entry
    counts = Counter(entry["status"] for entry in results.values())
    built = sum(counts[s] for s in ("same", "differ", "reader_refuses", "unmodelled_kind",
                                    "no_cache_both"))
    classes = Counter(entry["model_class"].startswith("Transformers")
                      for entry in results.values() if "layers" in entry)
    rows = ["| config | source | vLLM 0.34 | reader | first difference, or why refused |",
            "|---|---|---|---|---|"]
    for name, entry in sorted(results.items()):
        status = entry["status"]
        vllm = (f"{entry['model_class']}, {len(entry['layers'])} cache layers"
                if "layers" in entry else "refuses" if status in (
                    "refused_by_both", "reader_plans") else status.replace("_", " "))
        why = (entry.get("why", "") if status not in ("refused_by_both", "no_cache_both")
               else f"vLLM: {entry.get('why', 'no cache layer')} / reader: "
                    f"{entry.get('reader_why', '')}")
        why = " ".join(str(why).split()).replace("|", "/")[:300]
        rows.append(f"| {name} | {entry.get('source', '')} | {vllm} | "
                    f"{STATUSES.get(status, '')} | {why} |")
    TABLE_DOC.write_text(
        "# vLLM 0.34 over transformers' decoder language models\n\n"
        "Written by `references/vllm_transformers_sweep.py` (vLLM 0.34 venv, transformers "
        f"`{importlib.import_module('transformers').__version__}`): every decoder model_type of "
        "transformers' causal-LM enumeration with its config class's defaults (at most 4 "
        "decoder layers), published checkpoints of architectures vLLM's registry does not "
        "name, and the tests/hf_configs fixtures it does not name, each built by vLLM 0.34 "
        "(its registry, then its Transformers modeling backend, then its refusals) with the "
        "resolved class on the meta device, and read by the config reader. Compared: the "
        "model class vLLM resolves, and every cache layer (names, kinds, heads, head sizes, "
        "dtypes, windows, MLA rows, states, cross-layer sharing); where vLLM refuses, the "
        "reader must refuse. tests/presets/test_vllm_transformers_sweep.py pins this table without "
        "vLLM.\n\n"
        f"{len(results)} configs: {built} built on meta ({classes[False]} by vLLM's own "
        f"classes, {classes[True]} by the Transformers backend), {counts['same']} equal, "
        f"{counts['differ']} differing, {counts['reader_refuses']} refused by the reader "
        f"alone, {counts['no_cache_both']} with no cache layer (an encoder), refused by the "
        f"reader; {counts['refused_by_both'] + counts['reader_plans']} refused by vLLM, "
        f"{counts['refused_by_both']} of them refused by the reader too; "
        f"{counts['defaults_incomplete']} whose class defaults lack a field vLLM's code "
        "reads and no cache depends on; "
        f"{counts['no_config'] + counts['sweep_error'] + counts['vllm_cannot_build']} not "
        "built here (no config, or the harness: a kernel vLLM's CPU build lacks, a "
        "processor's files).\n\n"
        + "\n".join(rows) + "\n")
    keys = ("source", "status", "model_class", "length", "layers", "shared", "config")
    pinned = {name: {key: entry[key] for key in keys if key in entry
                     and (key != "config" or "layers" in entry or entry["status"] in (
                         "refused_by_both", "reader_plans"))}
              for name, entry in sorted(results.items())}
    TABLE_PIN.write_text("{\n" + ",\n".join(f"{json.dumps(name)}: {json.dumps(entry)}"
                                              for name, entry in pinned.items()) + "\n}\n")
    print(f"{len(results)} configs: {built} built, {dict(counts)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="only these names (default: all)")
    parser.add_argument("--table", action="store_true", help="rewrite the table only")
    parser.add_argument("--registry-batch", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.registry_batch:
        sweep.registry_batch(args.registry_batch.split(","), sweep_one)
        return 0
    if args.table:
        write_table()
        return 0
    from vllm_hf_layers import STUBS

    stubs = Path(tempfile.mkdtemp())
    (stubs / "sitecustomize.py").write_text(STUBS)
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR",
           "PYTHONPATH": os.pathsep.join(
               [str(stubs), str(REPO / "src"), str(REPO / "references"),
                os.environ.get("PYTHONPATH", "")])}
    if not args.names:
        print(f"seeded from the registry sweep: {seed_from_registry()}", flush=True)
    sweep.sweep_registry_build(args.names, env, every=every_name, script=__file__,
                               results=RESULTS, table=write_table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
