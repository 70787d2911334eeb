"""Where the repository's folders are, for tests and harnesses in any folder."""

from __future__ import annotations

from pathlib import Path
from typing import Final

TESTS: Final = Path(__file__).resolve().parent.parent
REPO: Final = TESTS.parent
HF_CONFIGS: Final = TESTS / "hf_configs"
