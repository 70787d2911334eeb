"""The docs that ship with the package: every reference a message, a docstring or the trace
makes lands on a heading that exists; no user-facing text cites the internal SPEC; the wheel
carries the docs; every plan model and field is described."""

from __future__ import annotations

import importlib
import inspect
import re
import tomllib
from pathlib import Path

import pytest
from pydantic import BaseModel

import hisparse_plan as hp
from hisparse_plan.models import plan as plan_models
from hisparse_plan.models.group_specs import HisparseHotSpec, HisparseResidentSpec, UniformTypeSpec
from hisparse_plan.models.layer_specs import LAYER_SPEC_CLASSES
from hisparse_plan.models.pools import BufferView, PageRange, Pool
from hisparse_plan.models.request import (
    DeviceConfig,
    HisparseConfig,
    ModelConfig,
    PipelineStage,
    PlanRequest,
    SchedulerConfig,
)
from hisparse_plan.models.sglang_plan import SGLangBudget, SGLangHisparse, SGLangPlan
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.presets import Settings, build_request, load_preset
from hisparse_plan.rule_docs import ANCHORS, DOC_NAMES, rule_doc
from hisparse_plan.targets.vllm import plan_traced
from support import paths
from support.cli_support import Run
from support.golden import GOLDEN

REPO = paths.REPO
DOCS = REPO / "docs"
SRC = REPO / "src" / "hisparse_plan"
REFERENCE = re.compile(r"docs/([\w-]+\.md)((?:#[\w-]+)?(?:, #[\w-]+)*)")


def slugs(path: Path) -> set[str]:
    """GitHub's anchors for a Markdown file's headings."""
    found = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def test_every_reference_in_the_source_lands_on_a_heading() -> None:
    checked = 0
    for path in SRC.rglob("*.py"):
        for match in REFERENCE.finditer(path.read_text(encoding="utf-8")):
            doc = DOCS / match.group(1)
            assert doc.is_file(), f"{path}: {match.group(0)}"
            for anchor in re.findall(r"#([\w-]+)", match.group(2)):
                assert anchor in slugs(doc), f"{path}: #{anchor} not in {doc.name}"
                checked += 1
    assert checked > 30


def test_rule_anchors_exist() -> None:
    rules = slugs(DOCS / "planning-rules.md")
    assert {anchor for _, anchor in ANCHORS} <= rules
    assert rule_doc("7.3.2 step 1") == "docs/planning-rules.md#unified-pages"
    assert rule_doc("5.12 / 7.7") == "docs/planning-rules.md#admission"
    assert rule_doc("7.3") == "docs/planning-rules.md#grouping"
    assert rule_doc("6.1") == "docs/plan-contract.md"


@pytest.mark.parametrize("model", ["deepseek-v3.2", "gemma-3-27b", "qwen3-next-80b"])
def test_every_traced_rule_has_an_anchor(model: str) -> None:
    request = build_request(load_preset(model).architecture, Settings(max_model_len=32768))
    for decision in plan_traced(request).trace.decisions:
        assert "#" in rule_doc(decision.rule), decision.rule


def test_refusals_cite_the_docs_not_the_spec() -> None:
    cases = sorted(GOLDEN.glob("*reject*.request.json"))
    assert cases
    for path in cases:
        with pytest.raises(hp.PlanError) as refused:
            hp.plan(hp.PlanRequest.model_validate_json(path.read_text()))
        message = str(refused.value)
        assert "SPEC" not in message, path.name
        assert "../shared" not in message, path.name


def test_admission_refusal_points_at_the_admission_rule() -> None:
    request = build_request(load_preset("llama-3-70b").architecture,
                            Settings(gpu_mem_bytes=2**30))
    with pytest.raises(hp.PlanError, match=r"see docs/planning-rules\.md#admission"):
        hp.plan(request)


def test_no_user_facing_string_cites_the_spec() -> None:
    """Messages raised and every docstring of the public models, errors, CLI and operator."""
    public = ["models", "operator", "cli", "presets", "exchange", "errors.py", "__init__.py"]
    for part in public:
        root = SRC / part
        for path in [root] if root.is_file() else root.rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            assert not re.search(r"SPEC \d", text), path
            assert "../shared" not in text, path


def test_the_wheel_carries_the_docs() -> None:
    """Every page of docs/, and nothing else of it, ships; `hisparse-plan docs` knows each."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    included = project["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    pages = {path.stem for path in DOCS.glob("*.md")}
    shipped = {source: target for source, target in included.items()
               if source.startswith("docs/")}
    assert shipped == {f"docs/{name}.md": f"hisparse_plan/docs/{name}.md" for name in pages}
    assert set(DOC_NAMES) == pages
    assert len(DOC_NAMES) == len(set(DOC_NAMES))


def test_docs_lists_and_prints_every_page(cli: Run) -> None:
    code, out, err = cli("docs", "--list")
    assert (code, err) == (0, "")
    listed = [line.split()[0] for line in out.splitlines()]
    assert listed == list(DOC_NAMES)
    assert "Glossary" in out
    for name in DOC_NAMES:
        code, out, _ = cli("docs", name)
        assert code == 0, name
        assert out == (DOCS / f"{name}.md").read_text(encoding="utf-8"), name


def test_readme_and_docs_cite_no_spec_section() -> None:
    """The pages cite docs/ anchors, never the internal spec's section numbers."""
    for page in [REPO / "README.md", *DOCS.glob("*.md")]:
        text = page.read_text(encoding="utf-8")
        assert "SPEC" not in text, page.name
        assert not re.search(r"\bspec(?:'s)? (?:section|is silent)", text, re.IGNORECASE), page.name
        prose = re.sub(r"`[^`\n]*`", "", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S))
        # The spec's sections are numbered 4 to 7: "7.3.2", "section 5.12", "rule 7.7".
        cited = re.search(r"(?<![\w.])[4-7]\.\d+\.\d+(?![\w.])|(?:section|rule|§)\s*[4-7]\.\d",
                          prose, re.IGNORECASE)
        assert cited is None, f"{page.name}: {cited and cited.group(0)}"


def test_page_links_land_on_headings() -> None:
    """Links between pages (`page.md#anchor`) reach a file of docs/ and one of its headings."""
    checked = 0
    for page in [REPO / "README.md", *DOCS.glob("*.md")]:
        base = page.parent
        for target, anchor in re.findall(r"\]\(((?:docs/)?[\w-]+\.md)(?:#([\w-]+))?\)",
                                         page.read_text(encoding="utf-8")):
            doc = base / target
            assert doc.is_file(), f"{page.name}: {target}"
            if anchor:
                assert anchor in slugs(doc), f"{page.name}: {target}#{anchor}"
                checked += 1
    assert checked >= 10


PLAN_MODELS: list[type[BaseModel]] = [
    plan_models.KVCachePlan, plan_models.KVCacheGroup, plan_models.KVCacheTensor,
    plan_models.HostPool, plan_models.DevicePool, plan_models.Capacity, plan_models.Workload,
    UniformTypeSpec, HisparseResidentSpec, HisparseHotSpec,
    Pool, PageRange, BufferView, SGLangPlan, SGLangBudget, SGLangHisparse,
]


@pytest.mark.parametrize("model", PLAN_MODELS, ids=lambda m: m.__name__)
def test_plan_models_and_fields_are_described(model: type[BaseModel]) -> None:
    assert model.__doc__
    assert model.__doc__.strip()
    for name, field in model.model_fields.items():
        if name == "kind":
            continue
        assert field.description, f"{model.__name__}.{name}"


def test_plan_contract_names_every_plan_field() -> None:
    text = (DOCS / "plan-contract.md").read_text(encoding="utf-8")
    for model in [*PLAN_MODELS[:7], *PLAN_MODELS[10:14]]:
        for name in model.model_fields:
            assert f"`{name}`" in text, f"{model.__name__}.{name}"


def test_docs_command_prints_what_messages_cite(cli: Run) -> None:
    code, out, err = cli("docs")
    assert (code, err) == (0, "")
    assert out == (DOCS / "planning-rules.md").read_text(encoding="utf-8")
    assert "## Admission" in out
    code, out, _ = cli("docs", "plan-contract", "--path")
    assert code == 0
    assert Path(out.strip()) == DOCS / "plan-contract.md"


@pytest.mark.parametrize(
    "model",
    [*sorted(LAYER_SPEC_CLASSES, key=lambda m: m.__name__), PlanRequest, ModelConfig,
     HisparseConfig, DeviceConfig, PipelineStage, SchedulerConfig, SGLangSettings],
    ids=lambda m: m.__name__,
)
def test_request_models_and_fields_are_described(model: type[BaseModel]) -> None:
    assert model.__doc__
    assert model.__doc__.strip()
    for name, field in model.model_fields.items():
        if name in ("kind", "model", "device", "scheduler"):
            continue  # the tag, and sections whose own models are described
        assert field.description, f"{model.__name__}.{name}"


PUBLIC_MODULES = ("hisparse_plan", "hisparse_plan.targets.vllm", "hisparse_plan.checking",
                  "hisparse_plan.views", "hisparse_plan.exchange", "hisparse_plan.operator",
                  "hisparse_plan.presets", "hisparse_plan.rules", "hisparse_plan.adapters.vllm")


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_public_docstrings_cite_the_docs_not_the_spec(name: str) -> None:
    """What `help()` shows a user: the module and everything it exports."""
    module = importlib.import_module(name)
    assert "SPEC" not in (module.__doc__ or ""), name
    for export in getattr(module, "__all__", []):
        value = getattr(module, export)
        if inspect.isfunction(value) or inspect.isclass(value):
            assert "SPEC" not in (inspect.getdoc(value) or ""), f"{name}.{export}"


def test_installed_docs_are_found_inside_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the wheel puts them (force-include to hisparse_plan/docs/), and nowhere else."""
    from hisparse_plan import rule_docs

    package = tmp_path / "site-packages" / "hisparse_plan"
    (package / "docs").mkdir(parents=True)
    (package / "docs" / "planning-rules.md").write_text("# Planning rules\n")
    monkeypatch.setattr(rule_docs, "__file__", str(package / "rule_docs.py"))
    assert rule_docs.doc_path("planning-rules") == package / "docs" / "planning-rules.md"
    with pytest.raises(hp.PlanError, match="neither in the package nor beside it"):
        rule_docs.doc_path("plan-contract")


def test_glossary_explains_the_words_the_output_uses() -> None:
    """Each word the plan output and the pages lean on has an entry of its own."""
    entries = " ".join(re.findall(r"^\*\*(.+?)\*\*", (DOCS / "glossary.md").read_text(
        encoding="utf-8"), flags=re.MULTILINE)).lower()
    for word in ("null block", "padding page", "layout", "page", "group", "pool", "view",
                 "admitted", "steady", "binds", "placeholder sizes", "baseline", "hisparse"):
        assert word in entries, word
    text = (DOCS / "glossary.md").read_text(encoding="utf-8")
    for word in ("BLNHC", "**source**", "**indexer**", "**resident**", "**hot**", "60 GiB",
                 "64 GiB", "ranges"):
        assert word in text, word
