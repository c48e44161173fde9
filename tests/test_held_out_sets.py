"""The evaluation sets built from Debian's reference text (cli/held_out_sets.py, cli/man_pages.py), on
small files written here in the sources' formats."""

import gzip
import json

from densehybrid.cli import held_out_sets, man_pages

PAGE = r""".\" a comment that is no text
.TH CP 1
.SH NAME
cp \- copy files and directories
.SH SYNOPSIS
.B cp
[\fIOPTION\fR]... SOURCE DEST
.SH DESCRIPTION
Copy SOURCE to DEST.
.TP
.BR \-\-preserve\-links ", " \-a
keep the links\(emas they were.
.SH SEE ALSO
.BR mv (1)
"""


def test_a_roff_page_reads_as_its_name_summary_and_plain_sections(tmp_path):
    path = tmp_path / "cp.1.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(PAGE)
    page = man_pages.read_page(path)
    assert page.names == ("cp",) and page.summary == "copy files and directories"
    assert page.sections["DESCRIPTION"] == "Copy SOURCE to DEST. --preserve-links, -a keep the links-as they were."
    assert page.sections["SYNOPSIS"] == "cp [OPTION]... SOURCE DEST"
    assert list(page.sections) == ["NAME", "SYNOPSIS", "DESCRIPTION", "SEE ALSO"]


def test_a_page_that_points_at_another_has_no_text(tmp_path):
    path = tmp_path / "alias.1"
    path.write_text(".so man1/cp.1\n")
    assert man_pages.read_page(path) is None


def test_long_options_are_found_whole():
    text = "use --preserve-links or --no-clobber, not -x or --all or a--b-c"
    assert held_out_sets.OPTION.findall(text) == ["--preserve-links", "--no-clobber"]


def test_dictd_offsets_are_base_64_most_significant_first():
    assert held_out_sets.dictd_offset("A") == 0 and held_out_sets.dictd_offset("/") == 63
    assert held_out_sets.dictd_offset("BA") == 64 and held_out_sets.dictd_offset("Gb9L") == ((6 * 64 + 27) * 64 + 61) * 64 + 11


def test_foldoc_entries_are_read_where_the_index_places_them(tmp_path):
    entries = [("ADT", "abstract data type\nADT\n\n   <programming> (ADT) A kind of {data abstraction} where a type's "
                "form is hidden (https://example.org/x).\n\n   (2003-07-03)\n\n"),
               ("COTS", "COTS\n\n   <software> commercial off-the-shelf software sold in volume.\n\n")]
    got = held_out_sets.foldoc_entries(_dictd(tmp_path, "foldoc", entries))
    # a URL goes with whatever follows it up to the next space (here its closing bracket and full stop)
    assert got == [("abstract data type", "(ADT) A kind of data abstraction where a type's form is hidden"),
                   ("COTS", "commercial off-the-shelf software sold in volume.")]


def _b64(value):
    digits = ""
    while True:
        digits = held_out_sets.DICTD_DIGITS[value % 64] + digits
        value //= 64
        if not value:
            return digits


def test_pairs_whose_query_or_passage_repeats_are_dropped():
    pairs = [("a", "What is X?", "p1"), ("b", "what is x?", "p2"), ("c", "Q3", "p3"), ("d", "Q4", "p3"),
             ("e", "Q5", "p5")]
    assert held_out_sets.unique(pairs) == [("e", "Q5", "p5")]


def test_wordnet_instances_become_questions_about_them(tmp_path):
    lines = ["  1 this is the licence header",
             "00060548 04 n 02 Hegira 1 Hejira 1 001 @i 00058743 n 0000 | the flight of Muhammad from Mecca to "
             "Medina in 622; \"an example\"  ",
             "10000001 18 n 01 Ada_Lovelace 0 001 @i 00007846 n 0000 | English mathematician who wrote the first "
             "published program  ",
             "10000002 15 n 01 Paris 0 001 @i 00007847 n 0000 | the capital and largest city of France  ",
             "10000003 03 n 01 cat 0 001 @ 00007848 n 0000 | a small domesticated feline animal kept as a pet  "]
    (tmp_path / "data.noun").write_text("\n".join(lines) + "\n")
    got = held_out_sets.entity_pairs(tmp_path / "data.noun")
    assert got == [("wn00060548", "What is Hegira?", "the flight of Muhammad from Mecca to Medina in 622"),
                   ("wn10000001", "Who is Ada Lovelace?", "English mathematician who wrote the first published program"),
                   ("wn10000002", "Where is Paris?", "the capital and largest city of France")]


def test_a_set_is_written_in_beir_columns(tmp_path):
    pairs = [(f"id{i}", f"query {i}", f"passage number {i}") for i in range(10)]
    held_out_sets.write_pairs(tmp_path, pairs, 6, 3, 0)
    corpus = [json.loads(line) for line in (tmp_path / "corpus.jsonl").read_text().splitlines()]
    queries = [json.loads(line) for line in (tmp_path / "queries.jsonl").read_text().splitlines()]
    qrels = (tmp_path / "qrels.tsv").read_text().splitlines()
    assert len(corpus) == 6 and len(queries) == 3 and qrels[0] == "query-id\tcorpus-id\tscore"
    ids = {c["_id"] for c in corpus}
    assert all(line.split("\t")[1] in ids for line in qrels[1:])
    assert set(held_out_sets.digests(tmp_path)) == {"corpus.jsonl", "queries.jsonl", "qrels.tsv"}


def _dictd(folder, name, entries):
    data, index, placed = b"", [], {}
    for heading, entry in entries:
        raw = entry.encode()
        if entry not in placed:  # an entry listed under several headings is stored once
            placed[entry], data = len(data), data + raw
        index.append(f"{heading}\t{_b64(placed[entry])}\t{_b64(len(raw))}")
    with gzip.open(folder / f"{name}.dict.dz", "wb") as f:
        f.write(data)
    (folder / f"{name}.index").write_text("\n".join(index) + "\n")
    return folder / f"{name}.dict.dz"


def test_dictionary_words_become_questions_about_their_definitions(tmp_path):
    majority = ("Majority \\Ma*jor\"i*ty\\, n.; pl. {Majorities}. [Cf. F.\n   majorit['e], LL. majoritas. See {Major}.]\n"
                "   1. The quality or condition of being major or greater; superiority in number.\n   [1913 Webster]\n")
    entries = [("Majority", majority), ("Majorities", majority),  # one entry under two headings: kept once
               ("A priori", "A priori \\A pri*o\"ri\\ the reasoning from causes to the effects they have.\n"),
               ("Cat", "Cat \\Cat\\, n.\n   A small animal.\n")]  # too short
    got = held_out_sets.word_pairs(_dictd(tmp_path, "gcide", entries))
    assert got == [("gcide:Majority", "What does majority mean?",
                    "1. The quality or condition of being major or greater; superiority in number.")]


def test_keys_are_configuration_names_and_upper_case_variables():
    text = "Set PermitRootLogin no; LD_LIBRARY_PATH and PAM_SERVICE, not Linux, HTTP, _X or Foo-BarBaz."
    assert held_out_sets.KEY.findall(text) == ["PermitRootLogin", "LD_LIBRARY_PATH", "PAM_SERVICE"]


def _page(name, summary, description):
    return f".TH {name.upper()} 5\n.SH NAME\n{name} \\- {summary}\n.SH DESCRIPTION\n{description}\n"


def test_a_key_one_page_alone_names_points_at_that_page_and_a_format_at_its_description(tmp_path):
    (tmp_path / "man5").mkdir()
    filler = " ".join(f"word{i}" for i in range(30))
    (tmp_path / "man5" / "sshd_config.5").write_text(_page("sshd_config", "OpenSSH daemon configuration file",
                                                           f"{filler} PermitRootLogin says whether root may log in. "
                                                           "SHARED_NAME too."))
    (tmp_path / "man5" / "other.5").write_text(_page("other", "another file", f"{filler} SHARED_NAME is here."))
    keys = held_out_sets.key_pairs(tmp_path)
    assert [(i, q) for i, q, _ in keys] == [("man5/sshd_config.5", "PermitRootLogin")]
    assert keys[0][2].startswith("word10 ") and "PermitRootLogin says whether" in keys[0][2]
    formats = held_out_sets.format_pairs(tmp_path)  # "another file" is too short a summary to ask by
    assert [(i, q) for i, q, _ in formats] == [("man5/sshd_config.5", "OpenSSH daemon configuration file")]
    assert formats[0][2].startswith("word0 word1 ")


def test_the_manual_page_sets_can_be_built_from_pages_that_are_not_installed(tmp_path, capsys):
    root = tmp_path / "unpacked" / "usr" / "share" / "man"
    for section in ("1", "3"):
        (root / f"man{section}").mkdir(parents=True)
    filler = " ".join(f"word{i}" for i in range(30))
    for name in ("alpha", "beta"):  # each names one option no other page names
        (root / "man1" / f"{name}.1").write_text(_page(name, f"the {name} tool", f"{filler} --{name}-only-option."))
        (root / "man3" / f"{name}_call.3").write_text(_page(f"{name}_call", f"the {name} call", f"{name} {filler}"))
    held_out_sets.main([str(tmp_path / "sets"), "--set", "options", "--set", "identifiers", "--man-root", str(root),
                        "--passages", "2", "--queries", "2"])
    for name, queries in (("options", {"--alpha-only-option", "--beta-only-option"}),
                          ("identifiers", {"alpha_call", "beta_call"})):
        got = [json.loads(line)["text"] for line in (tmp_path / "sets" / name / "queries.jsonl").open()]
        assert set(got) == queries
    assert "options: 2 pairs" in capsys.readouterr().out
