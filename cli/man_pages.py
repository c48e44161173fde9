"""Plain text from the roff sources of installed manual pages (``/usr/share/man``), for evaluation sets.

Enough of the ``man`` macros is read to get a page's NAME line and the text of its sections: requests
(lines that start with ``.``) are dropped, except the font macros (``.B``, ``.BR``, ``.I`` ...) whose
arguments are text; escapes are replaced by the characters they stand for or dropped. Pages that only
point at another (``.so``) have no text of their own and give None.
"""

from __future__ import annotations

import gzip
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

FONT_MACROS = {".B", ".I", ".BR", ".RB", ".IR", ".RI", ".BI", ".IB", ".SM", ".SB"}
ESCAPES = {r"\-": "-", r"\(em": "-", r"\(en": "-", r"\(aq": "'", r"\(dq": '"', r"\(lq": '"', r"\(rq": '"',
           r"\(oq": "'", r"\(cq": "'", r"\e": "\\", r"\(bu": "", r"\&": "", r"\~": " ", r"\ ": " ", r"\0": " ",
           r"\|": "", r"\^": "", r"\:": "", r"\/": "", r"\,": ""}
FONT = re.compile(r"\\f(\[[^\]]*\]|\(..|.)")
OTHER_ESCAPE = re.compile(r"\\(\(..|\[[^\]]*\]|\*\(..|\*\[[^\]]*\]|\*.|s[-+]?\d+|.)")


@dataclass(frozen=True)
class ManPage:
    names: tuple[str, ...]  # the NAME line's names, in its order
    summary: str  # the NAME line after its dash
    sections: dict[str, str]  # section title (upper case) -> its text


def text_line(line: str) -> str:
    """One roff line as plain text ('' for requests that carry none)."""
    if line.startswith((".", "'")):
        macro, _, rest = line.partition(" ")
        if macro not in FONT_MACROS:
            return ""
        try:
            words = shlex.split(rest.replace("\\", "\\\\"), posix=True)
        except ValueError:
            words = rest.split()
        # alternating-font macros join their arguments without spaces
        line = ("" if len(macro) == 3 else " ").join(words)
    for escape, replacement in ESCAPES.items():
        line = line.replace(escape, replacement)
    return OTHER_ESCAPE.sub("", FONT.sub("", line.replace("\\\\", "\\")))


def read_page(path: Path) -> ManPage | None:
    """The page at ``path`` (gzip or plain), or None when it has no NAME line or only points at another."""
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except (OSError, EOFError):
        return None
    if any(line.startswith(".so ") for line in lines[:5]):
        return None
    sections: dict[str, list[str]] = {}
    current = None
    for line in lines:
        if line.startswith((".SH", ".Sh")):
            current = " ".join(text_line(line.replace(".SH", ".B", 1).replace(".Sh", ".B", 1)).split()).upper()
            sections.setdefault(current, [])
        elif current is not None and not line.startswith('.\\"'):
            sections[current].append(text_line(line))
    text = {title: " ".join(" ".join(body).split()) for title, body in sections.items()}
    names, dash, summary = text.get("NAME", "").partition(" - ")
    if not dash or not summary.strip():
        return None
    return ManPage(tuple(n.strip() for n in names.split(",") if n.strip()), summary.strip(), text)


def pages(sections: tuple[str, ...], root: Path = Path("/usr/share/man")) -> list[tuple[str, ManPage]]:
    """(file name, page) of every readable page in ``root``'s ``man<section>`` folders, sorted by name."""
    found = []
    for section in sections:
        for path in sorted((root / f"man{section}").glob("*")):
            page = read_page(path)
            if page is not None:
                found.append((f"{section}/{path.name.removesuffix('.gz')}", page))
    return found
