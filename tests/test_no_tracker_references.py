"""The repository speaks to its users: no pointers into a tracker or a design file they do not have.

Code, comments, help texts, tests and docs say why in their own words, or link the docs page where the
reasoning lives. This test fails on any such pointer in a tracked text file.
"""

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# assembled from parts so that this file does not match itself
POINTERS = re.compile("|".join([r"\b[Ii]ssues? #?\d+", r"\b[Tt]asks? #?\d+", r"\bDESI" + r"GN\b", "\u00a7"]))


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    files = []
    for name in listed.decode().split("\0"):
        path = REPO / name
        if not name or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" not in data[:8192]:  # text, not an image or a model file
            files.append(path)
    return files


def test_the_pattern_catches_what_it_must():
    issue, task = "is" + "sue", "ta" + "sk"  # spelled in parts: this file is tracked too
    for text in (f"see {issue} 16", f"({issue.title()} 4)", f"{task} 3", "DESI" + "GN \u00a710", "(\u00a72.5)"):
        assert POINTERS.search(text), text
    for text in ("by design", "a design choice", "the issue is", "Ray tasks", "tissue 5"):
        assert not POINTERS.search(text), text


def test_no_tracked_file_points_at_a_tracker_or_the_design_file():
    files = tracked_text_files()
    assert any(path.name == "README.md" for path in files) and len(files) > 100
    found = [f"{path.relative_to(REPO)}:{number}: {line.strip()[:120]}"
             for path in files
             for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
             if POINTERS.search(line)]
    assert not found, "say why, or link the docs page where the reasoning lives:\n" + "\n".join(found)
