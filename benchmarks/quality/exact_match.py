"""Each part alone, the ``auto`` mix, and ``auto`` as searches run it (an identifier's holders first), on judged
sets: what ``index.search.identifiers`` gains and costs.

The rule (``index.search.identifiers``): a query that looks like an identifier (one token holding ``-``,
``_``, ``.``, ``:``, ``/`` or ``$``, or inner capitals) has the passages among the mix's best 100 that hold it
whole ranked first, each group in the mix's order. Other queries keep the mix's order, so a set without such
queries scores exactly as the mix does.

    python -m densehybrid.bench.quality.exact_match --set NAME=SET_DIR:INDEX_DIR ... [--shaped NAME ...]
        [--dense-weight NAME=W ...] --out exact-match.json

Each set's queries are searched with each part alone, the plain ``auto`` mix (first stage ``ip``, K1 = 1000
per part, the exact rerank, as ``fusion_rules`` does) and ``auto`` as ``eval`` and ``/search`` run it, the
holders read from the index's stored documents. ``--shaped`` marks the sets the rule was designed on.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from densehybrid.encoder.batches import encode_in_batches
from densehybrid.index import evaluate
from densehybrid.index.building.commands import encoder_for_index, search_texts
from densehybrid.index.search import identifiers
from densehybrid.index.search.params import SearchParams
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.served.loading import load_index

PARAMS = SearchParams(k=10, candidates=1000)


def measure_set(name: str, set_dir: Path, index_dir: Path, dense_weight: float | None = None) -> dict:
    """nDCG@10 of each part alone, the plain ``auto`` mix (at ``dense_weight`` where given, in place of the
    weight the index chose) and ``auto`` with the identifiers' holders first, on one set."""
    index = load_index(index_dir)
    encoder = encoder_for_index(index)
    qids, texts, qrels = evaluate.read_judged(set_dir / "queries.jsonl", set_dir / "qrels.tsv")
    prompt = index.prompts.for_role("query")
    batches = [b.encoded for b in encode_in_batches(encoder, [prompt + t for t in texts], "query", 64)]
    searcher = Searcher(index)
    auto = PARAMS.but(method="auto", dense_weight=dense_weight)
    runs = {}
    for system, params in {"lexical": PARAMS.but(method="lexical"), "dense": PARAMS.but(method="dense"),
                           "auto": auto}.items():
        found = [searcher.search(encoded, params) for encoded in batches]
        runs[system] = ([i for f in found for i in f.ids], [s for f in found for s in f.scores])
    served = search_texts(encoder, searcher, texts, auto)
    runs["auto, identifiers first"] = (served.ids, served.scores)
    scores = {system: round(evaluate.evaluate(evaluate.to_run(qids, ids, found), qrels)["nDCG@10"], 4)
              for system, (ids, found) in runs.items()}
    better = max(scores["lexical"], scores["dense"])
    return {"set": name, "queries": len(qids),
            "identifier_queries": sum(map(identifiers.looks_like_identifier, texts)),
            "auto_weight": index.auto_mix[1] if dense_weight is None else dense_weight, "ndcg_at_10": scores,
            "over_better_part": {s: round(v - better, 4) for s, v in scores.items() if s not in ("lexical", "dense")}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", action="append", required=True, dest="sets", metavar="NAME=SET_DIR:INDEX_DIR")
    parser.add_argument("--shaped", action="append", default=[], help="a set the rule was designed on")
    parser.add_argument("--dense-weight", action="append", default=[], metavar="NAME=W",
                        help="search a set's auto mix at this weight (an index built before today's default rule)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    weights = {name: float(w) for name, w in (spec.split("=", 1) for spec in args.dense_weight)}
    rows = []
    for spec in args.sets:
        name, dirs = spec.split("=", 1)
        set_dir, index_dir = dirs.split(":", 1)
        rows.append(measure_set(name, Path(set_dir), Path(index_dir), weights.get(name)) | {"shaped": name in args.shaped})
        print(json.dumps(rows[-1]), flush=True)
    args.out.write_text(json.dumps({"rule": "auto, identifiers first", "depth": identifiers.DEPTH, "sets": rows},
                                   indent=1) + "\n")


if __name__ == "__main__":
    main()
