"""Test doubles and helpers shared by the test files; none of it ships in the wheel."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# what a child Python process needs on its path to import both ``densehybrid`` and ``support``
PYTHONPATH = os.pathsep.join([str(REPO), str(REPO / "tests")])
