"""Evaluation sets of other shapes than docstrings, from reference text that Debian installs.

Each set pairs a query with its one relevant passage by the source's own structure (no judge):

- ``entities`` (``wordnet-base``): entity-centric questions. Each WordNet instance noun (a person,
  place, event...) named once gives "Who is NAME?" (people), "Where is NAME?" (places) or "What is
  NAME?", and its passage is the entity's gloss, which seldom repeats the name.
- ``computing`` (``dict-foldoc``): "What is TERM?" of each term of the Free On-line Dictionary of
  Computing, and its passage the entry's first ``MAX_WORDS`` words (the term itself is the heading,
  left out of the passage).
- ``identifiers`` (``manpages-dev`` and the section 2 and 3 pages installed): the query is a C
  function's or call's name alone (``pthread_mutex_lock``), its passage the page's DESCRIPTION.
- ``options`` (the section 1 and 8 pages installed): the query is a long option that one page alone
  names (``--preserve-timestamps``), its passage ``MAX_WORDS`` words of that page from just before the
  option's first mention.
- ``long`` (the section 1 and 8 pages installed): the query is a command's one-line summary with its
  name left out ("copy files and directories"), its passage the page's text from DESCRIPTION on, of
  ``LONG_WORDS`` words or more (longer than the encoders read).
- ``words`` (``dict-gcide``): "What does WORD mean?" of each one-word heading of the GNU Collaborative
  International Dictionary of English, its passage the entry's first ``MAX_WORDS`` words after the
  heading line (the definitions, which use the word's other forms more than the word).
- ``formats`` (the section 5 and 7 pages installed): the query is a file format's or overview page's
  one-line summary with its name left out ("format of the system password file"), its passage the
  page's first ``MAX_WORDS`` words from DESCRIPTION on.
- ``keys`` (the section 5 and 7 pages installed): the query is a configuration key or variable that one
  page alone names (``PermitRootLogin``, ``LD_LIBRARY_PATH``), its passage ``MAX_WORDS`` words of that
  page from just before the key's first mention.

Queries or passages that occur twice are dropped; a seeded sample of the pairs is the corpus, a
second one of the corpus the queries (as ``stdlib_eval_set``).

    python -m densehybrid.cli.held_out_sets OUT_DIR [--set NAME]...
        [--passages 1500] [--queries 400] [--man-root DIR]

writes ``OUT_DIR/SET/corpus.jsonl``, ``queries.jsonl`` and ``qrels.tsv`` (BEIR columns) and prints
each file's SHA-256, so a set built again can be told apart from the one measured.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from densehybrid.cli.man_pages import pages
from densehybrid.cli.stdlib_eval_set import write_pairs

MAX_WORDS = 120
LONG_WORDS = 300
LONG_MAX_WORDS = 1000
MIN_WORDS = 12
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)+")  # a long option of two words or more
OPTION_CONTEXT = 20  # words of a passage before its option's first mention
WORDNET_NOUNS = Path("/usr/share/wordnet/data.noun")
FOLDOC = Path("/usr/share/dictd/foldoc.dict.dz")
MAN = Path("/usr/share/man")
GCIDE = Path("/usr/share/dictd/gcide.dict.dz")
# a key of two capitalised words or more (``PermitRootLogin``), or an upper-case name with an underscore
KEY = re.compile(r"(?<![\w-])(?:[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+)+|[A-Z][A-Z0-9]*_[A-Z0-9_]*[A-Z0-9])(?![\w-])")
DICTD_DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
# WordNet's lexicographer files of people and places (noun.person, noun.location)
PERSON, LOCATION = 18, 15
LEFT_OUT_SECTIONS = {"SEE ALSO", "AUTHOR", "AUTHORS", "COPYRIGHT", "REPORTING BUGS", "BUGS", "HISTORY", "COLOPHON"}
Pair = tuple[str, str, str]  # (passage id, query, passage)


def unique(pairs: list[Pair]) -> list[Pair]:
    """``pairs`` whose query and passage occur once."""
    queries = Counter(q.lower() for _, q, _ in pairs)
    passages = Counter(p for _, _, p in pairs)
    return [(i, q, p) for i, q, p in pairs if queries[q.lower()] == 1 and passages[p] == 1]


def entity_pairs(path: Path = WORDNET_NOUNS) -> list[Pair]:
    """WordNet's instance nouns: (synset, question about its first name, its gloss without examples)."""
    pairs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith(" ") or " @i " not in line:
            continue
        fields, _, gloss = line.partition(" | ")
        offset, lexfile, _, count, *rest = fields.split()
        name = rest[0].replace("_", " ")
        definition = gloss.split('; "')[0].strip().rstrip(";")
        question = {PERSON: "Who is", LOCATION: "Where is"}.get(int(lexfile), "What is")
        if len(definition.split()) >= MIN_WORDS // 2:
            pairs.append((f"wn{offset}", f"{question} {name}?", definition))
    return unique(pairs)


def dictd_offset(digits: str) -> int:
    """A dictd index's base-64 number (``A`` = 0 ... ``/`` = 63, most significant first)."""
    value = 0
    for digit in digits:
        value = value * 64 + DICTD_DIGITS.index(digit)
    return value


def dictd_entries(path: Path) -> list[tuple[str, str]]:
    """(index heading, raw text) of each entry of a dictd dictionary, as its index places them; an entry
    listed under several headings is kept under the first."""
    data = gzip.open(path, "rb").read()
    entries, seen = [], set()
    for line in path.with_suffix("").with_suffix(".index").read_text(encoding="utf-8").splitlines():
        heading, offset, length = line.split("\t")
        where = (dictd_offset(offset), dictd_offset(length))
        if where not in seen:
            seen.add(where)
            entries.append((heading, data[where[0]:sum(where)].decode("utf-8", "replace")))
    return entries


def foldoc_entries(path: Path = FOLDOC) -> list[tuple[str, str]]:
    """(heading, body) of each FOLDOC entry as its dictd index places it: the first line is the heading, the
    rest the body, with its subject tags, cross-reference braces, URLs (and what follows them up to a space)
    and closing date taken out. An
    entry listed under several headings is kept under the first."""
    entries = []
    for _, entry in dictd_entries(path):
        headings, _, body = entry.partition("\n\n")
        heading = headings.splitlines()[0] if headings.strip() else ""
        body = re.sub(r"\(\d{4}-\d{2}-\d{2}\)", " ", body)
        body = re.sub(r"\(?(https?|ftp)://\S+\)?", " ", body)
        body = re.sub(r"^(\s*<[^>]*>)+", "", body.strip())
        entries.append((heading.strip(), " ".join(body.replace("{", "").replace("}", "").split())))
    return entries


def computing_pairs(path: Path = FOLDOC) -> list[Pair]:
    pairs = []
    for heading, text in foldoc_entries(path):
        words = text.split()
        named = re.fullmatch(r"[A-Za-z0-9][^{}<>:]*", heading) and len(heading.split()) <= 6
        if len(words) >= MIN_WORDS and named and not text.startswith("See"):
            pairs.append((f"foldoc:{'_'.join(heading.split())}", f"What is {heading}?", " ".join(words[:MAX_WORDS])))
    return unique(pairs)


def word_pairs(path: Path = GCIDE) -> list[Pair]:
    """(heading, "What does WORD mean?", the entry's text after its heading line) of GCIDE's one-word
    headings, with its source marks (``[1913 Webster]``), braces and pronunciation marks taken out."""
    pairs = []
    for heading, entry in dictd_entries(path):
        if not re.fullmatch(r"[A-Za-z]{3,}", heading):
            continue
        unmarked, before = entry, None
        while unmarked != before:  # etymologies and sources span lines and hold bracketed accents
            before, unmarked = unmarked, re.sub(r"\[[^\[\]]*\]", " ", unmarked)
        body = unmarked.partition("\n")[2].replace("{", "").replace("}", "")
        words = body.split()
        if len(words) >= MIN_WORDS:
            pairs.append((f"gcide:{heading}", f"What does {heading.lower()} mean?", " ".join(words[:MAX_WORDS])))
    return unique(pairs)


def format_pairs(root: Path = MAN) -> list[Pair]:
    pairs = []
    for name, page in pages(("5", "7"), root):
        titles = list(page.sections)
        if "DESCRIPTION" not in titles:
            continue
        words = " ".join(page.sections[t] for t in titles[titles.index("DESCRIPTION"):]
                         if t not in LEFT_OUT_SECTIONS).split()
        summary = " ".join(w for w in page.summary.split() if w.lower() not in {n.lower() for n in page.names})
        if len(words) >= MIN_WORDS and len(summary.split()) >= 3:
            pairs.append((f"man{name}", summary, " ".join(words[:MAX_WORDS])))
    return unique(pairs)


def identifier_pairs(root: Path = MAN) -> list[Pair]:
    pairs = []
    for name, page in pages(("2", "3"), root):
        words = page.sections.get("DESCRIPTION", "").split()
        query = page.names[0] if page.names else ""
        if len(words) >= MIN_WORDS and re.fullmatch(r"[A-Za-z_][\w:.]*", query):
            pairs.append((f"man{name}", query, " ".join(words[:MAX_WORDS])))
    return unique(pairs)


def long_pairs(root: Path = MAN) -> list[Pair]:
    pairs = []
    for name, page in pages(("1", "8"), root):
        titles = list(page.sections)
        if "DESCRIPTION" not in titles:
            continue
        kept = [page.sections[t] for t in titles[titles.index("DESCRIPTION"):] if t not in LEFT_OUT_SECTIONS]
        words = " ".join(kept).split()
        summary = " ".join(w for w in page.summary.split() if w.lower() not in {n.lower() for n in page.names})
        if len(words) >= LONG_WORDS and len(summary.split()) >= 3:
            pairs.append((f"man{name}", summary, " ".join(words[:LONG_MAX_WORDS])))
    return unique(pairs)


def option_pairs(root: Path = MAN) -> list[Pair]:
    return named_once_pairs(("1", "8"), OPTION, root)


def key_pairs(root: Path = MAN) -> list[Pair]:
    return named_once_pairs(("5", "7"), KEY, root)


def named_once_pairs(sections: tuple[str, ...], pattern: re.Pattern, root: Path = MAN) -> list[Pair]:
    """(page, the first (sorted) of its ``pattern`` matches that no other page names, the ``MAX_WORDS`` words
    from a few before its first mention) of the pages of ``sections``."""
    texts = {name: " ".join(page.sections.values()) for name, page in pages(sections, root)}
    named = {name: sorted(set(pattern.findall(text))) for name, text in texts.items()}
    pages_naming = Counter(option for options in named.values() for option in options)
    pairs = []
    for name, options in named.items():
        once = [o for o in options if pages_naming[o] == 1]
        if once:
            words = texts[name].split()
            first = next(i for i, w in enumerate(words) if once[0] in w)
            start = max(0, first - OPTION_CONTEXT)
            pairs.append((f"man{name}", once[0], " ".join(words[start:start + MAX_WORDS])))
    return unique(pairs)


SETS: dict[str, Callable[..., list[Pair]]] = {"entities": entity_pairs, "computing": computing_pairs,
                                             "identifiers": identifier_pairs, "long": long_pairs,
                                             "options": option_pairs, "words": word_pairs,
                                             "formats": format_pairs, "keys": key_pairs}


MAN_SETS = ("identifiers", "long", "options", "formats", "keys")  # the sets made of manual pages


def digests(folder: Path) -> dict[str, str]:
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
            for name in ("corpus.jsonl", "queries.jsonl", "qrels.tsv")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--set", action="append", choices=sorted(SETS), dest="sets")
    parser.add_argument("--passages", type=int, default=1500)
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--man-root", type=Path, default=None,
                        help="the manual pages' folder (its man1 ... man8) for the sets made of them; default "
                             f"{MAN}, e.g. pages unpacked from packages that are not installed")
    args = parser.parse_args(argv)
    for name in args.sets or list(SETS):
        pairs = SETS[name](args.man_root) if args.man_root and name in MAN_SETS else SETS[name]()
        corpus, queries = write_pairs(args.out / name, pairs, args.passages, args.queries, args.seed)
        print(f"{name}: {len(pairs)} pairs, {corpus} passages, {queries} queries")
        for file, digest in digests(args.out / name).items():
            print(f"  {file} sha256 {digest}")


if __name__ == "__main__":
    main()
