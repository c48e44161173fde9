"""Running the schemathesis CLI against a live server: ``--checks all``, a seed, the project's hooks."""

import os
import re
import subprocess
import sys
from pathlib import Path

# 413 is the contract's answer to a batch over its limit (the schema states both maxItems and the 413);
# schemathesis' default list of rejection statuses lacks it
CONFIG = """
[checks.negative_data_rejection]
expected-statuses = [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429]
"""
HOOKS = Path(__file__).parent / "schemathesis_hooks.py"


def schemathesis_cli() -> list[str]:
    return [sys.executable, "-c", "from schemathesis.cli import schemathesis; schemathesis()"]


def run_schemathesis(url: str, seed: int, folder: Path, examples: int,
                     phases: str = "examples,coverage,fuzzing,stateful") -> subprocess.CompletedProcess:
    """The CLI on ``url``'s own ``/openapi.json``, run in ``folder`` (where it keeps its config and replay files).

    ``examples`` bounds the examples and fuzzing phases; the coverage phase sends every boundary case the
    schema has, however many that is."""
    config = folder / "schemathesis.toml"
    config.write_text(CONFIG)
    command = [*schemathesis_cli(), "--no-color", "--config-file", str(config), "run", f"{url}/openapi.json",
               "--checks", "all", "--max-examples", str(examples), "--seed", str(seed), "--max-failures", "20",
               "--phases", phases]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=folder,
                          env={**os.environ, "SCHEMATHESIS_HOOKS": str(HOOKS)})


def all_operations_tested(stdout: str, at_least: int = 15) -> bool:
    """Whether the run tested every operation it selected, all of the schema's, and at least ``at_least``."""
    selected = re.search(r"Selected: (\d+)/(\d+)", stdout)
    tested = re.search(r"Tested: (\d+)", stdout)
    return bool(selected and tested) and (
        int(tested.group(1)) == int(selected.group(1)) == int(selected.group(2)) >= at_least)
