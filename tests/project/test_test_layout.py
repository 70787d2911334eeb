"""The tests mirror the source: a folder per room of the package (a target per engine under
tests/targets/), shared helpers in tests/support/, every test file named after what it checks
(never after the issue that asked for it), and no two test files of one name (pytest imports
each by its name)."""

from __future__ import annotations

import re
from collections import Counter

from support import paths

PACKAGE = paths.REPO / "src" / "hisparse_plan"
TESTS = paths.TESTS


def source_rooms() -> set[str]:
    """The package's rooms as tests/ folders: each subpackage, and targets/<engine>."""
    rooms = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    rooms |= {f"targets/{path.parent.name}" for path in (PACKAGE / "targets").glob("*/__init__.py")}
    return rooms


def test_a_folder_of_tests_per_source_room() -> None:
    missing = sorted(room for room in source_rooms()
                     if not any((TESTS / room).rglob("test_*.py")))
    assert missing == []


def test_every_test_file_sits_in_a_room_folder() -> None:
    assert sorted(path.name for path in TESTS.glob("test_*.py")) == []
    assert (TESTS / "support" / "__init__.py").is_file()


def test_no_test_file_is_named_after_an_issue() -> None:
    named = sorted(str(path.relative_to(TESTS)) for path in TESTS.rglob("*.py")
                   if re.search(r"issue|_\d{2,}\b|round\d", path.stem))
    assert named == []


def test_no_two_test_files_share_a_name() -> None:
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []


def test_the_checks_see_a_misplaced_file() -> None:
    assert re.search(r"issue|_\d{2,}\b|round\d", "test_cli_issue17_fixes")
    assert not re.search(r"issue|_\d{2,}\b|round\d", "test_vllm_034_modes")
    assert "targets/vllm" in source_rooms()
    assert "exchange" in source_rooms()
