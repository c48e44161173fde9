"""Corpus -> published index (docs/indexes.md): encode in batches, shard as it goes, resume, publish.

The corpus is read in order; every ``shard_size`` passages are encoded (in
length-sorted batches of ``batch_size`` to waste little padding) and written as
one shard. ``resume`` skips the shards already on disk. Equal inputs give equal
files: shard boundaries and batch composition depend only on the corpus and the
sizes, and every writer is deterministic (the manifest's creation time aside).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from densehybrid.encoder.base import SCALED_KINDS, Encoded, Encoder, EncoderSpec
from densehybrid.encoder.batches import encode_all
from densehybrid.encoder.checksums import sha256_file
from densehybrid.encoder.prompts import Prompts
from densehybrid.index.storage import documents, durable, files
from densehybrid.index.search import fusion
from densehybrid.index.building import (calibrate, calibration, calibration_queries, fusion_choice, lambda_auto,
                                         shards)
from densehybrid.index.building.first_stage import AnnConfig
from densehybrid.index.storage.documents import Document
from densehybrid.index.errors import IndexWriteError
from densehybrid.index.jsonl import read_jsonl, read_numbered_jsonl
from densehybrid.index.storage.payload import Payload, PayloadBuilder, PayloadError
from densehybrid.index.storage.vectors import VECTORS, open_vectors

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuildOptions:
    batch_size: int = 32
    shard_size: int = 4096
    # None: the encoder's own λ; a float: that λ; "auto": chosen from the corpus (index.lambda_auto)
    lam: float | str | None = None
    # an approximate first stage (an HNSW graph or product codes beside the exact rows); None: the exact flat scan
    ann: AnnConfig | None = None
    # the element type of the one stored copy of the vectors (index.storage.vectors): float16 or float32
    values_dtype: str = "float16"
    # with ``ann``: the recall@10 its default breadth keeps, measured at build (None: the breadth given stays,
    # measured all the same), on the queries of ``calibration_queries`` or on sentences cut from passages
    target_recall: float | None = calibration.DEFAULT_TARGET
    calibration_queries: Path | None = None
    # how searches mix the lexical and dense parts of dhr/fusion by default (index.fusion);
    # "auto": chosen from the corpus at the end of the build (index.building.fusion_choice)
    fusion_method: str = "lambda"
    # put before each passage (and recorded, so that queries get the query prompt at search time)
    prompts: Prompts = Prompts()
    name: str | None = None
    resume: bool = False
    overwrite: bool = False
    progress: bool = True
    # metadata fields kept as payload columns for filters (index.payload); fields_from_metadata keeps all
    fields: tuple[str, ...] = ()
    fields_from_metadata: bool = False


def read_corpus(path: Path) -> Iterator[Document]:
    """BEIR ``corpus.jsonl``: one JSON object per line with ``_id``, optional ``title``, ``text``."""
    for row in read_jsonl(path, required=("_id",), what="a corpus line with _id and text", error=IndexWriteError):
        yield Document(str(row["_id"]), str(row.get("title") or ""), str(row.get("text") or ""))


def read_payload(path: Path, names: Sequence[str] | None) -> Payload:
    """The ``metadata`` fields ``names`` (None: every field found) of each corpus line, as typed columns;
    a value of another type than the field's earlier ones is an IndexWriteError naming field and line."""
    try:
        builder = PayloadBuilder(names)
        for number, row in read_numbered_jsonl(path, required=("_id",), what="a corpus line with _id and text",
                                               error=IndexWriteError):
            builder.add(row.get("metadata"), f"{path}:{number}")
        return builder.finish()
    except PayloadError as exc:
        raise IndexWriteError(str(exc)) from exc


def count_corpus(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def passage_text(doc: Document) -> str:
    """Title and text joined by a space (the BEIR convention for single-sequence encoders)."""
    return f"{doc.title} {doc.text}" if doc.title else doc.text


def encode_passages(encoder: Encoder, texts: Sequence[str], batch_size: int,
                    on_batch: Callable[[int], object] = lambda n: None) -> Encoded:
    """Encode in length-sorted batches, returned in input order; ``on_batch(size)`` after each batch."""
    return encode_all(encoder, texts, "passage", batch_size, by_length=True, progress=on_batch)


def build_state(encoder: Encoder, corpus: Path, options: BuildOptions) -> dict:
    """What a resumed build must share with the interrupted one."""
    return {
        "format_version": files.FORMAT_VERSION,
        "corpus_sha256": sha256_file(corpus),
        "encoder": encoder.spec.to_dict(),
        "batch_size": options.batch_size,
        "shard_size": options.shard_size,
        **prompts_record(options.prompts),
    }


# encodes one shard's texts, in order, calling ``on_batch(size)`` as passages finish (index.ray_build has another)
ShardEncoder = Callable[[Sequence[str], Callable[[int], object]], Encoded]


def _encode_shards(encode_shard: ShardEncoder, corpus: Path, work: Path, options: BuildOptions, total: int) -> None:
    done = shards.completed(work)
    skip = done * options.shard_size
    if done:
        log.info("resuming: %d shards (%d passages) already encoded", done, min(skip, total))
    docs = islice(read_corpus(corpus), skip, None)
    with tqdm(total=total, initial=min(skip, total), unit="passage", desc="encode", disable=not options.progress,
              dynamic_ncols=True, smoothing=0.1) as bar:
        number = done
        prompt = options.prompts.for_role("passage")
        while batch := list(islice(docs, options.shard_size)):
            encoded = encode_shard([prompt + passage_text(d) for d in batch], bar.update)
            shards.write_shard(work, number, encoded.values, encoded.gates, batch)
            number += 1


def _staged_rows(encoder: Encoder, staged: Path, options: BuildOptions) -> tuple[np.ndarray, np.ndarray | None]:
    """The staged index's stored vectors and gates, memory-mapped."""
    _, values = open_vectors(staged / VECTORS, count=documents.DocTable(staged / documents.DOCS).count(),
                             dim=encoder.spec.dim, dtype=options.values_dtype)
    gates = np.load(staged / files.GATES, mmap_mode="r") if encoder.spec.gated_dim else None
    return values, gates


def _calibrated(encoder: Encoder, staged: Path, options: BuildOptions) -> dict:
    """The approximate first stage, built and calibrated (its recall curve and, for a target, the breadth that
    keeps it) -> its manifest record."""
    values, _ = _staged_rows(encoder, staged, options)
    queries = calibration_queries.queries_for(encoder, staged, values, file=options.calibration_queries,
                                    prompt=options.prompts.for_role("query"))
    return calibrate.write_calibrated(values, staged, options.ann, queries, options.target_recall)


def _lambda(encoder: Encoder, staged: Path, options: BuildOptions) -> tuple[float, dict]:
    if options.lam is None:
        return encoder.spec.lam, {"method": "model"}
    if options.lam != "auto":
        return float(options.lam), {"method": "fixed"}
    values, gates = _staged_rows(encoder, staged, options)
    texts = [passage_text(d) for d in documents.DocTable(staged / documents.DOCS).iter_rows()]
    return lambda_auto.choose(encoder, texts, values, gates, query_prompt=options.prompts.for_role("query"))


def _auto_fusion(encoder: Encoder, staged: Path, options: BuildOptions, fusion_info: dict) -> dict:
    """``fusion_info`` with the corpus's own mix added when the build asked for ``auto``."""
    if fusion_info.get("fusion", {}).get("method") != "auto":
        return fusion_info
    values, gates = _staged_rows(encoder, staged, options)
    docs = list(documents.DocTable(staged / documents.DOCS).iter_rows())
    chosen = fusion_choice.choose(encoder, docs, values, gates, query_prompt=options.prompts.for_role("query"),
                                passage_prompt=options.prompts.for_role("passage"))
    return {"fusion": {**fusion_info["fusion"], "auto": chosen}}


def prompts_record(prompts: Prompts) -> dict:
    """The manifest's ``prompts`` entry ({} for an index without prompts, as before they existed)."""
    return {"prompts": prompts.to_dict()} if prompts else {}


def fusion_record(spec: EncoderSpec, method: str) -> dict:
    """The manifest's ``fusion`` entry: the default weighting of a fused kind's parts ({} otherwise)."""
    if spec.kind not in SCALED_KINDS:
        return {}
    if method not in fusion.FUSION_METHODS:
        raise ValueError(f"unknown fusion method {method!r}; use one of {', '.join(fusion.FUSION_METHODS)}")
    return {"fusion": {"method": method, "dense_weight": fusion.DEFAULT_DENSE_WEIGHT, "rrf_k": fusion.DEFAULT_RRF_K}}


def build_index(encoder: Encoder, corpus: str | Path, out: str | Path, options: BuildOptions = BuildOptions(), *,
                encode_shard: ShardEncoder | None = None, engine: dict | None = None) -> Path:
    """Build and publish an index of ``corpus`` at ``out``; returns ``out``.

    ``encode_shard`` replaces the in-process encoding (a Ray build passes its own and an ``engine``
    record for the manifest); everything else, shards and resume included, is the same.
    """
    corpus, out = Path(corpus), Path(out)
    if options.batch_size < 1 or options.shard_size < 1:
        raise ValueError("batch_size and shard_size must be >= 1")
    if out.exists() and not options.overwrite:
        raise IndexWriteError(f"{out}: already exists (use --overwrite to replace it)")
    fusion_info = fusion_record(encoder.spec, options.fusion_method)
    # read first: a field whose type changes halfway through the corpus fails before any encoding
    payload = (read_payload(corpus, None if options.fields_from_metadata else options.fields)
               if options.fields or options.fields_from_metadata else None)
    total = count_corpus(corpus)
    work = shards.work_dir(out)
    shards.start(work, build_state(encoder, corpus, options), resume=options.resume)
    if encode_shard is None:
        def encode_shard(texts, on_batch):
            return encode_passages(encoder, texts, options.batch_size, on_batch)
    _encode_shards(encode_shard, corpus, work, options, total)
    spec = encoder.spec
    # the approximate first stage is built after the texts are staged: its calibration cuts queries from them
    staged, first_stage = shards.assemble(work, count=total, dim=spec.dim, gated_dim=spec.gated_dim,
                                          values_dtype=options.values_dtype)
    if options.ann is not None:
        first_stage = _calibrated(encoder, staged, options)
    lam, lam_info = _lambda(encoder, staged, options)
    fusion_info = _auto_fusion(encoder, staged, options, fusion_info)
    fields_info = payload.write(staged) if payload is not None else {}
    files.write_manifest(
        staged, name=options.name or out.name, spec=spec, count=total, lam=lam, first_stage=first_stage,
        values_dtype=options.values_dtype,
        extra={"lambda": lam_info, "build": {"corpus_sha256": sha256_file(corpus), "batch_size": options.batch_size,
                                              "shard_size": options.shard_size, **(engine or {"engine": "local"})},
               **fusion_info, **prompts_record(options.prompts), **fields_info,
               "encoding": {"backend": encoder.backend, "precision": encoder.precision}},
    )
    durable.publish(staged, out, overwrite=options.overwrite)
    shards.finish(work)
    log.info("published index %s (%d passages, λ=%g by %s)", out, total, lam, lam_info["method"])
    return out


def build_from_arrays(out: str | Path, spec: EncoderSpec, encoded: Encoded, docs: Sequence[Document], *,
                      lam: float | None = None, name: str | None = None,
                      shard_size: int = 65_536, fusion_method: str = "lambda", payload: Payload | None = None,
                      values_dtype: str = "float16", ann: AnnConfig | None = None) -> Path:
    """Publish an index of already-encoded passages (tests, benchmarks, imports from other tools);
    ``payload`` adds filterable field columns (one row per document)."""
    out = Path(out)
    if fusion_method == "auto":
        raise ValueError("fusion 'auto' is chosen with the encoder, at build_index; give build_from_arrays a fixed method")
    if out.exists():
        raise IndexWriteError(f"{out}: already exists")
    if len(encoded) != len(docs) or encoded.values.shape[1] != spec.dim:
        raise ValueError(f"{len(encoded)} vectors of dim {encoded.values.shape[1]} for {len(docs)} docs, spec dim {spec.dim}")
    work = shards.work_dir(out)
    shards.start(work, {"encoder": spec.to_dict(), "from": "arrays"}, resume=False)
    for number, s in enumerate(range(0, len(docs), shard_size)):
        part = encoded[s:s + shard_size]
        shards.write_shard(work, number, part.values, part.gates, docs[s:s + shard_size])
    staged, first_stage = shards.assemble(work, count=len(docs), dim=spec.dim, gated_dim=spec.gated_dim,
                                          values_dtype=values_dtype, ann=ann)
    fields_info = {}
    if payload is not None and payload.columns:
        if payload.count != len(docs):
            raise ValueError(f"a payload of {payload.count} rows for {len(docs)} docs")
        fields_info = payload.write(staged)
    files.write_manifest(staged, name=name or out.name, spec=spec, count=len(docs), lam=spec.lam if lam is None else lam,
                         first_stage=first_stage, values_dtype=values_dtype,
                         extra={"lambda": {"method": "fixed"}, **fusion_record(spec, fusion_method), **fields_info})
    durable.publish(staged, out)
    shards.finish(work)
    return out
