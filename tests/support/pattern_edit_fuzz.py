"""The pattern-edit fuzzer: single and double edits of the JSON of patterns and staged
patterns compiled for the seed pairs (pattern_edit_seeds), each put through validation and
`check_pattern` / `check_staged`; every edit they accept is instantiated for the seed's
requests (each residue class its shape has) and run by the reference executor (a staged one
by the numpy staged executor), then judged by the transfer oracle's own arithmetic
(transfer_support.oracle: the source filled through its plans' views, the destination's
other blocks holding random canaries): a byte that is neither what the destination's views
place there nor (a window's first block, a last block's tail) the source's byte for it is
wrong. build_transfer's proved program is held to the same oracle on every request first.
Never judged by check_pattern itself.

Edits: a number (+-1, 0, doubled, halved, huge, another value of the field, plus or minus
another number of its object such as a block stride), a name, a flag or a null changed in
one place; an item of a list dropped, repeated or moved, or the list emptied. Shared by
tests/exchange/test_pattern_edit_fuzz.py and references/fuzz_pattern_edits.py."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import ValidationError

from hisparse_plan.errors import PlanError
from hisparse_plan.exchange.transfer import TransferRequest, build_transfer
from hisparse_plan.exchange.transfer.executors.rearrange import execute_staged
from hisparse_plan.exchange.transfer.executors.reference import Buffers, buffers, execute
from hisparse_plan.exchange.transfer.pattern.check_pattern import check_pattern
from hisparse_plan.exchange.transfer.pattern.check_staged import check_staged
from hisparse_plan.exchange.transfer.pattern.compile import compile_transfer
from hisparse_plan.exchange.transfer.pattern.staging import StagedPattern, compile_staged
from hisparse_plan.exchange.transfer.pattern.transfer_pattern import TransferPattern
from hisparse_plan.exchange.transfer.program.match import match_layers
from hisparse_plan.exchange.transfer.program.units import needed_units
from support.pattern_edit_seeds import SeedPair, seed_pairs
from support.transfer_support import layer_shapes, oracle, request_blocks, wrong_bytes

SAMPLES_A_KIND = 3
REQUESTS_PER_EDIT = 3
STAGING_LIMIT = 2**26
"""Staging bytes the fuzzer allocates for an accepted staged pattern; more is unjudged."""
HUGE = (2**28, 2**31, 2**62)


@dataclass
class Case:
    """One request of one seed, with the oracle's buffers."""

    request: TransferRequest
    source: Buffers
    start: Buffers
    expected: Buffers
    allowed: Buffers


@dataclass
class Seeded:
    pair: SeedPair
    pattern: TransferPattern
    staged: StagedPattern
    cases: list[Case]
    pattern_text: str = ""
    staged_text: str = ""
    pattern_sites: Sites | None = None
    staged_sites: Sites | None = None

    def __post_init__(self) -> None:
        self.pattern_text = self.pattern.model_dump_json()
        self.staged_text = self.staged.model_dump_json()
        self.pattern_sites = sites(json.loads(self.pattern_text))
        self.staged_sites = sites(json.loads(self.staged_text))


@dataclass
class Finding:
    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, example: str) -> None:
        self.count += 1
        if len(self.examples) < SAMPLES_A_KIND:
            self.examples.append(example)


@dataclass
class Tally:
    seeds: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    unsound: dict[str, Finding] = field(default_factory=dict)
    crashes: dict[str, Finding] = field(default_factory=dict)
    bad_seeds: list[str] = field(default_factory=list)

    @property
    def failures(self) -> int:
        return (sum(f.count for f in self.unsound.values())
                + sum(f.count for f in self.crashes.values()) + len(self.bad_seeds))

    def note(self, kind: dict[str, Finding], key: str, example: str) -> None:
        kind.setdefault(key, Finding()).add(example)


def _firsts(pair: SeedPair, tokens: int) -> tuple[dict[str, int], dict[str, int]]:
    """Each layer's first needed unit (its window or chunk) and the later of the two sides'
    block starts at or before it (where a pattern may start writing)."""
    firsts = {p.name: needed_units(p, tokens)[0] for p in match_layers(pair.source,
                                                                         pair.destination)
              if p.source.kind == "tokens"}
    ours, theirs = layer_shapes(pair.source), layer_shapes(pair.destination)
    reach = {name: max(first // ours[name].units * ours[name].units,
                       first // theirs[name].units * theirs[name].units)
             for name, first in firsts.items()}
    return firsts, reach


def seeded(pair: SeedPair, rng: random.Random, tally: Tally) -> Seeded | None:
    pattern = compile_transfer(pair.source, pair.destination)
    staged = compile_staged(pattern, 2)
    cases = []
    for tokens in pair.tokens:
        try:
            request = TransferRequest(
                num_tokens=tokens,
                source_blocks=request_blocks(pair.source, tokens, rng.randrange(2**16),
                                             runs=rng.random() < 0.5),
                destination_blocks=request_blocks(pair.destination, tokens,
                                                  rng.randrange(2**16),
                                                  runs=rng.random() < 0.5))
        except ValueError:
            continue  # the pools do not hold that many tokens
        firsts, reach = _firsts(pair, tokens)
        source, start, expected, allowed = oracle(pair.source, pair.destination, request,
                                                  pattern, firsts, reach, pair.states)
        case = Case(request, source, start, expected, allowed)
        built = build_transfer(pair.source, pair.destination, request)
        for what, program in (("build_transfer", built),
                              ("the compiled pattern", pattern.instantiate(request).program())):
            if _wrong(case, program) != 0:
                tally.bad_seeds.append(f"{pair.name}, {tokens} tokens: {what} is wrong")
                return None
        cases.append(case)
    if not cases:
        tally.bad_seeds.append(f"{pair.name}: no request fits its pools")
        return None
    for model in (pattern, staged):
        try:
            if type(model).model_validate_json(model.model_dump_json()) != model:
                raise ValueError("another pattern read back")
        except (ValueError, PlanError) as error:
            tally.bad_seeds.append(f"{pair.name}: its {type(model).__name__} does not survive "
                                   f"its own JSON: {error}"[:300])
            return None
    return Seeded(pair, pattern, staged, cases)


def _wrong(case: Case, program: Any) -> int:
    result = {key: value.copy() for key, value in case.start.items()}
    execute(program, case.source, result)
    return wrong_bytes(result, case.expected, case.allowed)


# ---- edits ---------------------------------------------------------------------------------

Path = tuple[str | int, ...]


def _leaves(doc: Any, path: Path = ()) -> list[Path]:
    if isinstance(doc, dict):
        return [leaf for key, value in doc.items() for leaf in _leaves(value, (*path, key))]
    if isinstance(doc, list):
        found = [leaf for index, value in enumerate(doc) for leaf in _leaves(value,
                                                                             (*path, index))]
        return found or [path]
    return [path]


def _lists(doc: Any, path: Path = ()) -> list[Path]:
    if isinstance(doc, dict):
        return [p for key, value in doc.items() for p in _lists(value, (*path, key))]
    if isinstance(doc, list):
        return [path, *(p for index, value in enumerate(doc)
                        for p in _lists(value, (*path, index)))]
    return []


def _get(doc: Any, path: Path) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def _set(doc: Any, path: Path, value: Any) -> None:
    _get(doc, path[:-1])[path[-1]] = value


def _kind(path: Path) -> tuple[str, ...]:
    return tuple("*" if isinstance(key, int) else key for key in path)


@dataclass
class Sites:
    """A document's leaves grouped by field (indices as *), and its lists."""

    by_field: dict[tuple[str, ...], list[Path]]
    lists: list[Path]
    values: dict[tuple[str, ...], list[Any]]


def sites(doc: Any) -> Sites:
    by_field: dict[tuple[str, ...], list[Path]] = {}
    for leaf in _leaves(doc):
        by_field.setdefault(_kind(leaf), []).append(leaf)
    values = {kind: sorted({json.dumps(_get(doc, p)) for p in paths})
              for kind, paths in by_field.items()}
    return Sites(by_field, _lists(doc), {k: [json.loads(v) for v in vs]
                                          for k, vs in values.items()})


def edit(doc: Any, where: Sites | None, rng: random.Random,
         focus: frozenset[str] | None = None) -> str:
    """One random edit of `doc` in place (of a field named in `focus` only, when given);
    returns what it did."""
    assert where is not None
    if where.lists and rng.random() < 0.15 and focus is None:
        path = rng.choice(where.lists)
        items = _get(doc, path)
        if not items:
            return f"{_name(path)}: empty, left"
        op = rng.choice(["drop", "repeat", "move", "empty"])
        at = rng.randrange(len(items))
        if op == "drop":
            del items[at]
        elif op == "repeat":
            items.insert(rng.randrange(len(items) + 1), json.loads(json.dumps(items[at])))
        elif op == "move":
            items.insert(rng.randrange(len(items)), items.pop(at))
        else:
            items.clear()
        return f"{_name(path)}: {op} item {at}"
    kinds = sorted(k for k in where.by_field if focus is None or str(k[-1]) in focus)
    kind = rng.choice(kinds or sorted(where.by_field))
    path = rng.choice(where.by_field[kind])
    old = _get(doc, path)
    new = _new_value(old, kind, path, doc, where, rng)
    _set(doc, path, new)
    return f"{_name(path)}: {json.dumps(old)[:40]} -> {json.dumps(new)[:40]}"


def _name(path: Path) -> str:
    return ".".join(str(key) for key in path) or "(root)"


def _new_value(old: Any, kind: tuple[str, ...], path: Path, doc: Any, where: Sites,
               rng: random.Random) -> Any:
    others = [v for v in where.values.get(kind, []) if v != old]
    if isinstance(old, bool):
        return not old
    if isinstance(old, int):
        siblings = [v for v in _get(doc, path[:-1]).values()
                    if isinstance(v, int) and not isinstance(v, bool) and v] \
            if isinstance(_get(doc, path[:-1]), dict) else []
        choices: list[Callable[[], Any]] = [
            lambda: old + 1, lambda: old - 1, lambda: 0, lambda: 1, lambda: old * 2,
            lambda: old // 2, lambda: rng.choice(HUGE), lambda: -1, lambda: None]
        if others:
            choices += [lambda: rng.choice(others)] * 3
        if siblings:
            choices += [lambda: old + rng.choice(siblings), lambda: old - rng.choice(siblings)]
        return rng.choice(choices)()
    if isinstance(old, str):
        pool = others or [old + "x"]
        return rng.choice([*pool, "", old + "x"])
    if old is None:
        return rng.choice([1, 16, 40, 64, 128, 256, 4096])
    if isinstance(old, list):
        return rng.choice([[], [0], None])
    return None


# ---- one edit, judged ----------------------------------------------------------------------

EXPECTED = (PlanError, ValidationError)


def one_edit(seed: Seeded, staged: bool, edits: int, rng: random.Random, tally: Tally,
             focus: frozenset[str] | None = None) -> None:
    model: TransferPattern | StagedPattern = seed.staged if staged else seed.pattern
    text = seed.staged_text if staged else seed.pattern_text
    doc = json.loads(text)
    done = [edit(doc, seed.staged_sites if staged else seed.pattern_sites, rng, focus)]
    for _ in range(edits - 1):
        done.append(edit(doc, sites(doc), rng, focus))
    what = f"{seed.pair.name} [{'staged' if staged else 'pattern'}] " + "; ".join(done)
    tally.outcomes["tried"] += 1
    text = json.dumps(doc)
    step = "validation"
    try:
        edited: TransferPattern | StagedPattern = type(model).model_validate_json(text)
        step = "check"
        if isinstance(edited, StagedPattern):
            check_staged(edited, seed.pair.source, seed.pair.destination)
        else:
            check_pattern(edited, seed.pair.source, seed.pair.destination)
    except EXPECTED:
        tally.outcomes["invalid" if step == "validation" else "refused"] += 1
        return
    except Exception as error:  # anything else is a finding
        tally.outcomes["crashed"] += 1
        tally.note(tally.crashes, f"{step}: {type(error).__name__}", f"{what}: {error}"[:300])
        return
    if edited.model_dump_json() == (seed.staged_text if staged else seed.pattern_text):
        tally.outcomes["accepted no-op"] += 1
        return
    judged = _judge(seed, edited, rng, what, tally)
    tally.outcomes[judged] += 1


def _judge(seed: Seeded, edited: TransferPattern | StagedPattern, rng: random.Random,
           what: str, tally: Tally) -> str:
    cases = rng.sample(seed.cases, min(REQUESTS_PER_EDIT, len(seed.cases)))
    verdict = "accepted sound"
    for case in cases:
        step = "instantiate"
        try:
            if isinstance(edited, StagedPattern):
                if max(edited.staging_bytes, default=0) > STAGING_LIMIT:
                    return "accepted, staging too large to run"
                made = edited.instantiate(case.request)
                step = "execute"
                staging = buffers(made.staging_regions(), fill=None, seed=3)
                result = {key: value.copy() for key, value in case.start.items()}
                execute_staged(made, case.source, staging, result)
            else:
                program = edited.instantiate(case.request).program()
                step = "execute"
                result = {key: value.copy() for key, value in case.start.items()}
                execute(program, case.source, result)
        except EXPECTED as error:
            if step == "execute":
                tally.note(tally.unsound, "executor refused an accepted pattern's request",
                           f"{what}: {error}"[:300])
                return "ACCEPTED UNSOUND"
            verdict = "accepted, a request refused"
            continue
        except Exception as error:  # anything else is a finding
            tally.note(tally.crashes, f"{step}: {type(error).__name__}",
                       f"{what}, {case.request.num_tokens} tokens: {error}"[:300])
            return "crashed"
        wrong = wrong_bytes(result, case.expected, case.allowed)
        if wrong:
            field_name = what.split("] ", 1)[1].split(":", 1)[0]
            tally.note(tally.unsound, f"{seed.pair.name}: {_field_kind(field_name)}",
                       f"{what}: {case.request.num_tokens} tokens, {wrong} wrong bytes")
            return "ACCEPTED UNSOUND"
    return verdict


def _field_kind(name: str) -> str:
    return ".".join("*" if part.isdigit() else part for part in name.split("."))


def run(seed: int, edits: int, pairs: int | None = None,
        progress: Callable[[Tally], None] | None = None, double: float = 0.3,
        focus: frozenset[str] | None = None) -> Tally:
    """`edits` edits spread over the seed pairs (the first `pairs` of them), a `double`
    share of them two edits at once, half of them of staged patterns; of the fields named
    in `focus` only, when given (list edits then left out)."""
    rng = random.Random(seed)
    np.random.seed(seed % 2**32)
    tally = Tally()
    ready = [s for s in (seeded(pair, rng, tally) for pair in seed_pairs()[:pairs])
             if s is not None]
    tally.seeds = len(ready)
    if not ready:
        return tally
    for number in range(edits):
        one_edit(rng.choice(ready), rng.random() < 0.5, 2 if rng.random() < double else 1,
                 rng, tally, focus)
        if progress is not None and (number + 1) % 1000 == 0:
            progress(tally)
    return tally


OUTCOMES = ("tried", "invalid", "refused", "accepted no-op", "accepted sound",
            "accepted, a request refused", "accepted, staging too large to run",
            "ACCEPTED UNSOUND", "crashed")


def report(tally: Tally) -> str:
    lines = [f"{tally.seeds} seed pairs"]
    lines += [f"  {name}: {tally.outcomes[name]}" for name in OUTCOMES]
    for title, kind in (("UNSOUND", tally.unsound), ("CRASHES", tally.crashes)):
        for key, finding in sorted(kind.items()):
            lines.append(f"  {title} {key}: {finding.count}")
            lines += [f"    e.g. {example}" for example in finding.examples]
    lines += [f"  BAD SEED {line}" for line in tally.bad_seeds]
    return "\n".join(lines)
