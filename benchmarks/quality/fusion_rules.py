"""Every ``--fusion auto`` rule on every evaluation set: each part alone, the rules, the best fixed weight.

For each set (an index built with ``--kind fusion`` and its judged queries) the queries are encoded
once and searched with each part alone and with the ``zscore`` mix at every dense weight of
``fusion_choice.WEIGHTS`` (first stage ``ip``, K1 = 1000 per part, the exact rerank), which gives the
set's nDCG@10 curve. The corpus's evidence (:func:`fusion_choice.gather` on the index's stored
vectors, the defaults a build uses) is then given to each rule, and each rule's weight is read off
the curve:

- ``paraphrases``: :func:`earlier_rules.paraphrases_alone`;
- ``keyword-bounded``: :func:`earlier_rules.keyword_bounded`;
- ``least-regret``: :func:`fusion_choice.choose_weight`, the default's rule.

No rule sees the judgements; the curve is only read after the choice. ``--parts-only`` measures each
part alone and nothing else (what a held-out set may show before a rule is looked at). ``--rejudge``
reads the curves of an earlier result and the gains ``--evidence`` saved with it, and scores the rules
of today on them without encoding anything again.

    python -m densehybrid.bench.quality.fusion_rules --set NAME=SET_DIR:INDEX_DIR ... [--shaped NAME ...]
        [--parts-only] [--evidence DIR] --out fusion-rules.json
    python -m densehybrid.bench.quality.fusion_rules --rejudge fusion-rules.json --evidence DIR --out F

``SET_DIR`` holds ``queries.jsonl`` and ``qrels.tsv``; ``--shaped`` marks the sets a rule was designed
on, so the summary keeps them apart from the held-out ones.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from densehybrid.bench.quality import earlier_rules
from densehybrid.encoder.batches import encode_in_batches
from densehybrid.index import evaluate
from densehybrid.index.building import fusion_choice
from densehybrid.index.building.commands import encoder_for_index
from densehybrid.index.search.params import SearchParams
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.served.loading import load_index

RULES = ("paraphrases", "keyword-bounded", "least-regret")
DEFAULT_RULE = "least-regret"
PARAMS = SearchParams(k=10, candidates=1000)


def curve(index, encoder, set_dir: Path, parts_only: bool) -> dict[str, float]:
    """nDCG@10 of each part alone and (unless ``parts_only``) of ``zscore`` at each weight, keyed
    "lexical", "dense", "0.0" ... "1.0"."""
    qids, texts, qrels = evaluate.read_judged(set_dir / "queries.jsonl", set_dir / "qrels.tsv")
    prompt = index.prompts.for_role("query")
    batches = [b.encoded for b in encode_in_batches(encoder, [prompt + t for t in texts], "query", 64)]
    searcher = Searcher(index)
    systems = {"lexical": PARAMS.but(method="lexical"), "dense": PARAMS.but(method="dense")}
    if not parts_only:
        systems |= {f"{w:.1f}": PARAMS.but(method="zscore", dense_weight=w) for w in fusion_choice.WEIGHTS}
    measured = {}
    for name, params in systems.items():
        ids, scores = [], []
        for encoded in batches:
            found = searcher.search(encoded, params)
            ids += found.ids
            scores += found.scores
        measured[name] = round(evaluate.evaluate(evaluate.to_run(qids, ids, scores), qrels)["nDCG@10"], 4)
    return measured


def rule_weights(evidence: fusion_choice.Evidence) -> dict[str, dict]:
    current = fusion_choice.choose_weight(evidence)
    return {"paraphrases": {"weight": earlier_rules.paraphrases_alone(evidence.paraphrase)},
            "keyword-bounded": {"weight": earlier_rules.keyword_bounded(evidence.paraphrase, evidence.keyword)},
            "least-regret": {"weight": current.weight, "confidence": current.confidence, "reason": current.reason}}


def judged(row: dict, evidence: fusion_choice.Evidence) -> dict:
    """``row`` (a set's measured curve) with each rule's weight and what it scored on that curve."""
    rules = rule_weights(evidence)
    better = max(row["ndcg_at_10"]["lexical"], row["ndcg_at_10"]["dense"])
    for chosen in rules.values():
        chosen["ndcg_at_10"] = row["ndcg_at_10"][f"{chosen['weight']:.1f}"]
        chosen["over_better_part"] = round(chosen["ndcg_at_10"] - better, 4)
    fixed = {w: row["ndcg_at_10"][f"{w:.1f}"] for w in fusion_choice.WEIGHTS}
    best = max(fixed, key=fixed.get)
    return row | {"rules": rules, "best_fixed": {"weight": best, "ndcg_at_10": fixed[best]},
                  "evidence": fusion_choice.summary(evidence)}


def rejudge(result: dict, evidence_dir: Path) -> list[dict]:
    """The sets of an earlier ``result`` judged again by today's rules, from the gains saved beside it."""
    rows = []
    for row in result["sets"]:
        saved = np.load(evidence_dir / f"{row['set']}.npz")
        evidence = fusion_choice.Evidence(saved["paraphrase"], saved["keyword"], (), 0, 0)
        rows.append(judged({k: row[k] for k in ("set", "queries", "ndcg_at_10")}, evidence))
    return rows


def measure_set(name: str, set_dir: Path, index_dir: Path, parts_only: bool, evidence_dir: Path | None = None
                ) -> dict:
    index = load_index(index_dir)
    encoder = encoder_for_index(index)
    row = {"set": name, "queries": len(evaluate.read_judged(set_dir / "queries.jsonl", set_dir / "qrels.tsv")[0]),
           "ndcg_at_10": curve(index, encoder, set_dir, parts_only)}
    if parts_only:
        return row
    evidence = fusion_choice.gather(encoder, list(index.docs.iter_rows()), index.values, index.gates,
                                    query_prompt=index.prompts.for_role("query"),
                                    passage_prompt=index.prompts.for_role("passage"))
    if evidence_dir is not None:  # the gains, to study a rule offline without encoding again
        evidence_dir.mkdir(parents=True, exist_ok=True)
        np.savez(evidence_dir / f"{name}.npz", paraphrase=evidence.paraphrase, keyword=evidence.keyword)
    return judged(row, evidence)


def table(rows: list[dict], shaped: set[str]) -> str:
    lines = [f"| set (queries) | lexical | dense | {' | '.join(RULES)} | best fixed |", "|---" * 7 + "|"]
    for row in rows:
        got = row["ndcg_at_10"]
        cells = [f"{row['set']}{' *' if row['set'] in shaped else ''} ({row['queries']})",
                 f"{got['lexical']:.4f}", f"{got['dense']:.4f}"]
        if "rules" in row:
            cells += [f"{r['ndcg_at_10']:.4f} ({r['weight']:.1f}; {r['over_better_part']:+.4f})"
                      for r in (row["rules"][name] for name in RULES)]
            cells.append(f"{row['best_fixed']['ndcg_at_10']:.4f} ({row['best_fixed']['weight']:.1f})")
        lines.append("| " + " | ".join(cells + [""] * (7 - len(cells))) + " |")
    return "\n".join(lines)


def summary(rows: list[dict]) -> dict:
    """Per rule: the least and the mean margin over the better part alone, and the largest shortfall
    from the best of the other rules."""
    ruled = [r for r in rows if "rules" in r]
    if not ruled:
        return {}
    out = {}
    for name in RULES:
        margins = [r["rules"][name]["over_better_part"] for r in ruled]
        behind = [max(r["rules"][other]["ndcg_at_10"] for other in RULES) - r["rules"][name]["ndcg_at_10"]
                  for r in ruled]
        out[name] = {"least_margin": round(min(margins), 4), "mean_margin": round(float(np.mean(margins)), 4),
                     "most_behind_other_rules": round(max(behind), 4)}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", action="append", default=[], dest="sets", help="NAME=SET_DIR:INDEX_DIR")
    parser.add_argument("--rejudge", type=Path, help="an earlier result whose curves to judge again (with --evidence)")
    parser.add_argument("--shaped", action="append", default=[], help="a set the rule was designed on")
    parser.add_argument("--parts-only", action="store_true")
    parser.add_argument("--evidence", type=Path, help="also write each set's pseudo-query gains here (NAME.npz)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.rejudge is not None and args.evidence is None:
        parser.error("--rejudge reads the gains saved with --evidence DIR")
    rows = rejudge(json.loads(args.rejudge.read_text()), args.evidence) if args.rejudge else []
    for spec in args.sets:
        name, _, dirs = spec.partition("=")
        set_dir, _, index_dir = dirs.partition(":")
        rows.append(measure_set(name, Path(set_dir), Path(index_dir), args.parts_only, args.evidence))
        print(table(rows[-1:], set(args.shaped)).splitlines()[-1], flush=True)
    result = {"sets": rows, "shaped": args.shaped, "summary": summary(rows)}
    args.out.write_text(json.dumps(result, indent=1))
    print(table(rows, set(args.shaped)))
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
