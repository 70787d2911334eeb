"""The plan-edit fuzzer: random single edits of real plans (plan_edit_seeds), each put through
validation and `check_plan`; every edit check_plan accepts is judged twice:

1. by an oracle with its own arithmetic (plan_edit_oracle_vllm / plan_edit_oracle_sglang, whose
   docstrings define soundness): an accepted edit it finds unsound is a checker hole;
2. by `check_plan(plan, request=...)` with the seed's request: a changed plan must be refused.

Shared by tests/checking/test_plan_edit_fuzz.py and references/fuzz_plan_edits.py."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from hisparse_plan import check_plan
from hisparse_plan.errors import PlanError
from hisparse_plan.models.any_plan import Plan
from hisparse_plan.models.sglang_plan import SGLangPlan
from support.plan_edit_bytes import TooLarge
from support.plan_edit_faults import Faults
from support.plan_edit_mutations import Edit, Sites, random_edit, sites
from support.plan_edit_oracle_sglang import sglang_faults
from support.plan_edit_oracle_vllm import vllm_faults
from support.plan_edit_seeds import Seed, seeds_for

SAMPLES_A_KIND = 3


def faults_of(plan: Plan) -> Faults:
    """The oracle's verdict on any plan."""
    return sglang_faults(plan) if isinstance(plan, SGLangPlan) else vllm_faults(plan)


@dataclass
class Finding:
    """Edits of one kind (field and why), counted, with a few examples."""

    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, example: str) -> None:
        self.count += 1
        if len(self.examples) < SAMPLES_A_KIND:
            self.examples.append(example)


@dataclass
class Tally:
    engine: str
    seeds: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    unsound: dict[str, Finding] = field(default_factory=dict)
    """Accepted edits the oracle finds unsound, by (field | fault kind)."""
    with_request: dict[str, Finding] = field(default_factory=dict)
    """Changed plans check_plan(plan, request=...) accepted, by field."""
    crashes: dict[str, Finding] = field(default_factory=dict)
    """Anything but ValidationError / PlanError out of validation or check_plan, or an
    oracle error, by where and exception type."""
    unjudged: dict[str, Finding] = field(default_factory=dict)
    """Accepted edits too large to enumerate (plan_edit_bytes.MAX_RUNS), by field."""
    bad_seeds: list[str] = field(default_factory=list)
    """Seeds the oracle itself refuses (an oracle or planner bug)."""

    @property
    def failures(self) -> int:
        """Edits not proved sound or refused: unsound, passed with the request, crashed, or
        too large to judge; and seeds the oracle refuses."""
        found = (self.unsound, self.with_request, self.crashes, self.unjudged)
        return sum(f.count for kind in found for f in kind.values()) + len(self.bad_seeds)


OUTCOMES = ("tried", "invalid", "refused", "accepted no-op", "accepted sound", "ACCEPTED UNSOUND",
            "unjudged", "crashed", "request refused", "REQUEST ACCEPTED")
"""What becomes of an edit: refused by validation (invalid) or by check_plan; accepted and left
the plan as it was, accepted and sound, or accepted and unsound; too large to enumerate;
something other than the two refusals escaped. For accepted changes, what check_plan with the
request did."""


def _note(found: dict[str, Finding], key: str, example: str) -> None:
    found.setdefault(key, Finding()).add(example)


def judge(seed: Seed, edit: Edit, data: dict[str, Any], tally: Tally) -> None:
    """One edited plan through validation, check_plan and both judges, into the tally."""
    outcomes = tally.outcomes
    outcomes["tried"] += 1
    where = f"{seed.name}: {edit}"
    try:
        plan = type(seed.plan).model_validate(data)
    except ValidationError:
        outcomes["invalid"] += 1
        return
    except Exception as error:  # a crash is a finding, reported with its type
        outcomes["crashed"] += 1
        _note(tally.crashes, f"validation {type(error).__name__}", f"{where}: {error}")
        return
    try:
        check_plan(plan)
    except PlanError:
        outcomes["refused"] += 1
        return
    except Exception as error:
        outcomes["crashed"] += 1
        _note(tally.crashes, f"check_plan {type(error).__name__}", f"{where}: {error}")
        return
    if plan == seed.plan:
        outcomes["accepted no-op"] += 1
        return
    try:
        faults = faults_of(plan)
    except TooLarge as error:
        outcomes["unjudged"] += 1
        _note(tally.unjudged, edit.field, f"{where}: {error}")
        return
    except Exception as error:
        outcomes["crashed"] += 1
        _note(tally.crashes, f"oracle {type(error).__name__}", f"{where}: {error!r}")
        return
    if faults:
        outcomes["ACCEPTED UNSOUND"] += 1
        _note(tally.unsound, f"{edit.field} | {faults[0].kind}", f"{where} -- {faults[0]}")
    else:
        outcomes["accepted sound"] += 1
    _judge_with_request(seed, edit, plan, where, tally)


def _judge_with_request(seed: Seed, edit: Edit, plan: Plan, where: str, tally: Tally) -> None:
    try:
        check_plan(plan, request=seed.request)
    except PlanError:
        tally.outcomes["request refused"] += 1
        return
    except Exception as error:
        tally.outcomes["crashed"] += 1
        _note(tally.crashes, f"check_plan with request {type(error).__name__}",
              f"{where}: {error}")
        return
    tally.outcomes["REQUEST ACCEPTED"] += 1
    _note(tally.with_request, edit.field, where)


def run(engine: str, seed: int, edits: int, randoms: int = 8,
        progress: Callable[[Tally], None] | None = None) -> Tally:
    """`edits` random single edits of the seed plans of `engine`, all judged."""
    rng = random.Random(f"{engine}:{seed}")
    seeds = seeds_for(engine, rng, randoms)
    tally = Tally(engine, seeds=len(seeds))
    prepared: list[tuple[Seed, dict[str, Any], Sites]] = []
    for one in seeds:
        faults = faults_of(one.plan)
        if faults:
            tally.bad_seeds.append(f"{one.name}: {faults[0]}")
        data = one.plan.model_dump(mode="json")
        prepared.append((one, data, sites(data)))
    for count in range(edits):
        one, data, found = prepared[count % len(prepared)]
        edit, changed = random_edit(rng, data, found)
        judge(one, edit, changed, tally)
        if progress is not None and (count + 1) % 5000 == 0:
            progress(tally)
    return tally


def report(tally: Tally) -> str:
    """The tally as text: counts, then every unsound kind with examples."""
    lines = [f"== {tally.engine}: {tally.seeds} seed plans"]
    for outcome in OUTCOMES:
        lines.append(f"  {outcome:22s} {tally.outcomes[outcome]:8d}")
    for title, found in (("accepted but unsound (field | why)", tally.unsound),
                         ("changed plans check_plan accepted with the request", tally.with_request),
                         ("crashes", tally.crashes),
                         ("too large to judge", tally.unjudged)):
        if not found:
            continue
        lines.append(f"  {title}:")
        for key, finding in sorted(found.items(), key=lambda item: -item[1].count):
            lines.append(f"    {finding.count:6d}  {key}")
            lines.extend(f"              e.g. {example}" for example in finding.examples)
    for bad in tally.bad_seeds:
        lines.append(f"  SEED THE ORACLE REFUSES: {bad}")
    return "\n".join(lines)
