"""The out-of-domain evaluation set built from stdlib docstrings (cli/stdlib_eval_set.py)."""

import json

from densehybrid.cli.stdlib_eval_set import split_docstring, write_set


def test_split_docstring_takes_the_summary_sentence_as_query_and_the_body_as_passage():
    doc = """Return the frobnicated value of x. More summary text.

        The value is computed by frobnication, which folds
        the input twice and rounds it.
        """
    assert split_docstring(doc) == ("Return the frobnicated value of x.",
                                    "The value is computed by frobnication, which folds the input twice and rounds it.")
    assert split_docstring("One line only, no body at all here.") is None
    assert split_docstring("Too short.\n\nThe body has enough words to be a passage here.") is None


def test_the_set_is_deterministic_and_every_query_has_its_passage_in_the_corpus(tmp_path):
    a = write_set(tmp_path / "a", 150, 40, seed=3)
    b = write_set(tmp_path / "b", 150, 40, seed=3)
    assert a == b == (150, 40)
    for name in ("corpus.jsonl", "queries.jsonl", "qrels.tsv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    corpus = {d["_id"]: d for d in map(json.loads, (tmp_path / "a" / "corpus.jsonl").read_text().splitlines())}
    queries = [json.loads(line) for line in (tmp_path / "a" / "queries.jsonl").read_text().splitlines()]
    qrels = [line.split("\t") for line in (tmp_path / "a" / "qrels.tsv").read_text().splitlines()[1:]]
    assert len(qrels) == len(queries) == len({q["text"].lower() for q in queries})
    assert all(doc_id in corpus and grade.strip() == "1" for _, doc_id, grade in qrels)
    assert all(d["title"] == "" for d in corpus.values())  # the qualified name would give the answer away
    other = write_set(tmp_path / "c", 150, 40, seed=4)
    assert other == a and (tmp_path / "c" / "corpus.jsonl").read_bytes() != (tmp_path / "a" / "corpus.jsonl").read_bytes()


def test_a_package_set_walks_the_package_and_keeps_only_unique_pairs(tmp_path):
    from densehybrid.cli import package_eval_set

    names = package_eval_set.module_names("email")
    assert names[0] == "email" and "email.mime.text" in names and all("._" not in n for n in names)
    pairs = package_eval_set.unique_pairs(names)
    assert pairs and all(name.startswith("email") for name, _, _ in pairs)
    assert len({q.lower() for _, q, _ in pairs}) == len({p for _, _, p in pairs}) == len(pairs)
    package_eval_set.main([str(tmp_path / "set"), "--package", "email", "--passages", "30", "--queries", "10"])
    corpus = {d["_id"] for d in map(json.loads, (tmp_path / "set" / "corpus.jsonl").read_text().splitlines())}
    qrels = [line.split("\t") for line in (tmp_path / "set" / "qrels.tsv").read_text().splitlines()[1:]]
    assert len(corpus) == min(30, len(pairs)) and len(qrels) == min(10, len(corpus))
    assert all(doc_id in corpus for _, doc_id, _ in qrels)
