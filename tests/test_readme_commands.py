"""The README's two commands at the top are what a new user and CI run."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _top_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), flags=re.DOTALL)[:2]
    return [next(line for line in block.splitlines() if line and not line.startswith("#")) for block in blocks]


def test_ci_runs_exactly_the_readme_test_command():
    test_command = _top_commands()[1]
    ci_lines = (REPO / ".ci" / "run").read_text().splitlines()
    assert test_command in ci_lines
    assert "bash deploy/ci/install-validators.sh .venv" in test_command  # deploy tests need their validators
    assert test_command.endswith("python -m pytest")


def test_both_commands_install_the_pinned_cpu_torch_first():
    for command in _top_commands():
        assert command.index("pip install torch==2.13.0") < command.index("pip install -e")


def test_ci_builds_the_documentation_site_strictly_with_its_extra_installed():
    ci = (REPO / ".ci" / "run").read_text()
    assert ",docs]" in _top_commands()[1]
    assert "mkdocs build --strict" in ci
    assert ci.index(_top_commands()[1]) < ci.index("mkdocs build --strict")
