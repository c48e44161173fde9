"""A real corpus encoded by ``index build`` on one device, against a bare transformers forward of the same
checkpoint over the same passages.

    python -m densehybrid.bench.parts.corpus_encode CORPUS OUT_JSON (--model DIR | --random-shape bert-base)
        [--kind K] [--pooling mean] [--normalize] [--limit N] [--batch-size B] [--device cuda] [--label NAME]

``index build`` is timed whole, as a user runs it (corpus read, length-sorted batches, shards written,
the index published), with the model already loaded (its load is timed apart). The bare forward is
what a user's own loop would do with transformers: the same passages sorted by length, batches of the
same size tokenized (timed apart) and run through the model (the masked LM where the kind needs its
head, else the backbone) under the same float16 autocast, outputs left on the device. The rates project
the corpus's full size and MS MARCO's 8.8M passages (a projection holds for passages of this corpus's
lengths only: MS MARCO's are longer, so run its own passages for that figure).
"""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
import time
from itertools import islice
from pathlib import Path

import numpy as np
import torch

from densehybrid.bench.scale.gpu import MSMARCO_PASSAGES
from densehybrid.encoder.config import EncoderConfig
from densehybrid.encoder.device import autocast, pick_device
from densehybrid.encoder.model_dir import locate
from densehybrid.encoder.random_checkpoint import write_random_checkpoint
from densehybrid.index.building.build import BuildOptions, build_index, passage_text, read_corpus
from densehybrid.index.building.commands import load_model

PACKAGES_PASSAGES = 827_284


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def write_subset(corpus: Path, out: Path, limit: int | None) -> list[str]:
    """The first ``limit`` passages of ``corpus`` (.jsonl or .jsonl.gz) as a BEIR corpus at ``out`` -> their texts."""
    opener = gzip.open if corpus.suffix == ".gz" else open
    with opener(corpus, "rt", encoding="utf-8") as source, open(out, "w", encoding="utf-8") as subset:
        subset.writelines(islice((line for line in source if line.strip()), limit))
    return [passage_text(doc) for doc in read_corpus(out)]


def bare_forward(model_dir: str, with_mlm: bool, texts: list[str], batch_size: int, max_length: int,
                 device: torch.device) -> dict:
    """A plain transformers loop over ``texts`` sorted by length: tokenize, then forward; seconds of each."""
    from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = (AutoModelForMaskedLM if with_mlm else AutoModel).from_pretrained(model_dir).to(device).eval()
    ordered = sorted(texts, key=len)
    started = time.perf_counter()
    batches = [tokenizer(ordered[s:s + batch_size], padding=True, truncation=True, max_length=max_length,
                         return_tensors="pt") for s in range(0, len(ordered), batch_size)]
    tokenize_s = time.perf_counter() - started
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    with torch.inference_mode(), autocast(device):
        model(**{k: v.to(device) for k, v in batches[-1].items()})  # the longest batch first: allocations, kernels
        _synchronize(device)
        started = time.perf_counter()
        for batch in batches:
            model(**{k: v.to(device, non_blocking=True) for k, v in batch.items()})
        _synchronize(device)
    forward_s = time.perf_counter() - started
    return {"tokenize_s": round(tokenize_s, 3), "forward_s": round(forward_s, 3),
            "mean_tokens": round(tokens / len(texts), 1)}


def run(corpus: Path, config: EncoderConfig, *, label: str, device: str | None, limit: int | None,
        batch_size: int, work: Path) -> dict:
    subset = work / "corpus.jsonl"
    texts = write_subset(corpus, subset, limit)
    started = time.perf_counter()
    encoder = load_model(config, device)
    load_s = time.perf_counter() - started
    on = pick_device(device)
    started = time.perf_counter()
    build_index(encoder, subset, work / "index", BuildOptions(batch_size=batch_size, progress=False))
    build_s = time.perf_counter() - started
    spec = encoder.spec
    with_mlm = encoder.backbone.with_mlm
    del encoder
    bare = bare_forward(str(locate(config.model)), with_mlm, texts, batch_size, spec.max_passage_length, on)
    n = len(texts)
    ours = n / build_s
    return {"label": label, "kind": spec.kind, "model": spec.model_id, "device": str(on),
            "device_name": torch.cuda.get_device_name(on) if on.type == "cuda" else "cpu",
            "passages": n, "batch_size": batch_size, "max_passage_length": spec.max_passage_length,
            "mean_chars": round(float(np.mean([len(t) for t in texts])), 1), **bare,
            "model_load_s": round(load_s, 2), "build_s": round(build_s, 2),
            "build_pps": round(ours, 1), "bare_forward_pps": round(n / bare["forward_s"], 1),
            "bare_with_tokenization_pps": round(n / (bare["forward_s"] + bare["tokenize_s"]), 1),
            "build_over_bare_forward": round(ours / (n / bare["forward_s"]), 3),
            "projected_build_s": {"packages_827k": round(PACKAGES_PASSAGES / ours, 1),
                                  "msmarco_8.8M": round(MSMARCO_PASSAGES / ours, 1)}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", type=Path)
    parser.add_argument("out_json", type=Path)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="a model directory or zoo name")
    source.add_argument("--random-shape", help="a random-weight checkpoint of this shape (bert-base, tiny, ...)")
    parser.add_argument("--kind", default="cls")
    parser.add_argument("--pooling")
    parser.add_argument("--normalize", action="store_true", default=None)
    parser.add_argument("--limit", type=int)
    parser.add_argument("--batch-size", type=int, default=BuildOptions.batch_size)
    parser.add_argument("--device")
    parser.add_argument("--label")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="densehybrid-corpus-encode-") as tmp:
        model = args.model or str(write_random_checkpoint(Path(tmp) / "model", args.random_shape))
        config = EncoderConfig(model=model, kind=args.kind, pooling=args.pooling, normalize=args.normalize)
        result = run(args.corpus, config, label=args.label or f"{args.model or args.random_shape} {args.kind}",
                     device=args.device, limit=args.limit, batch_size=args.batch_size, work=Path(tmp))
    args.out_json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
