"""Small modules with one job: no product module grows past 300 lines.

A module that needs more has two jobs; split it (as the search device's choice left the searcher, and the
HTTP load client left the service benchmark) rather than raise the limit.
"""

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PRODUCT = ("encoder", "index", "service", "cli", "benchmarks")
MAX_LINES = 300


def test_no_product_module_is_over_the_limit():
    listed = subprocess.run(["git", "ls-files", "-z", "--", *PRODUCT], cwd=REPO, capture_output=True, check=True)
    modules = [REPO / name for name in listed.stdout.decode().split("\0") if name.endswith(".py")]
    assert len(modules) > 100  # the listing found the product
    too_long = {str(path.relative_to(REPO)): n for path in modules
                if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not too_long, f"modules over {MAX_LINES} lines: {too_long}"
