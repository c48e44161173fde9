"""Where a batch-1 torch first stage spends its time, part by part, on one device.

    python -m densehybrid.bench.parts.first_stage [DEVICE] [ROWS]     (DEVICE "": cuda when present; 1,000,000 rows)

Times, each on its own (median of 50 after 5 warm-ups, synchronised): the three ways to write the
inner products of one query with every row (``q @ V.T``, ``V @ q.T``, ``torch.mv``), the top 1,000 of
the scores in float32 and float16, a copy of the rows (the bandwidth reference), the whole
``TorchFlatIndex.search`` at k = 1,000 and 11, its device part (the product and the top-k) replayed
from a CUDA graph with the scores' top-k in each split of ``torch_graphs.PARTS`` (what launching
costs, and what each split saves), and what the search adds around its graph (the copies in and out,
through pinned and through pageable buffers, and the host's ordering); prints them as JSON with each
one's share of the search and the split the search's own capture chose.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import torch

from densehybrid.encoder.cuda_graph import capture
from densehybrid.encoder.device import to_host
from densehybrid.index.engines.torch_engine import TorchFlatIndex
from densehybrid.index.engines.torch_graphs import PARTS, top_k_over_chunks
from densehybrid.index.search.gip import sort_by_score

DIM, DEPTH = 768, 1000


def _median_ms(fn, device: torch.device, repeats: int = 50, warmup: int = 5) -> float:
    def done():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        fn()
    done()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        done()
        samples.append((time.perf_counter() - start) * 1000.0)
    return float(np.median(samples))


def _graphed_ms(index: TorchFlatIndex, query: torch.Tensor, device: torch.device, k: int, parts: int) -> float:
    """The search's device work (the product and the top-k in ``parts``) replayed from one CUDA graph,
    without the copies."""
    chunks = index.shards[0]
    _, graph = capture(lambda: top_k_over_chunks(query, [c.values for c in chunks], [c.start for c in chunks], k,
                                                 parts=parts), device)
    return _median_ms(graph.replay, device)


@torch.inference_mode()  # the pageable path writes the inference tensor its graph captured
def _host_side(index: TorchFlatIndex, xq: np.ndarray, device: torch.device, dtype: torch.dtype) -> dict[str, float]:
    """What the search adds around its graph at k = 1,000: the query's copy in and the top k's copy out, through
    the index's pinned buffers and, for comparison, through pageable ones (a copy and a wait each), and the
    host's ordering of the top k."""
    chunks, query = index.shards[0], torch.empty(1, DIM, device=device, dtype=dtype)
    (scores, rows), graph = capture(lambda: top_k_over_chunks(query, [c.values for c in chunks],
                                                              [c.start for c in chunks], DEPTH), device)

    def pageable():
        query.copy_(torch.from_numpy(xq).to(device, dtype))
        graph.replay()
        return to_host(scores, rows)

    found_scores, found_rows = index.graphed[0](xq, DEPTH)
    return {f"graphed call k={DEPTH}, pinned buffers": _median_ms(lambda: index.graphed[0](xq, DEPTH), device),
            f"graphed call k={DEPTH}, pageable copies": _median_ms(pageable, device),
            f"host ordering of the top {DEPTH}": _median_ms(lambda: sort_by_score(found_scores, found_rows, DEPTH),
                                                          device)}


def parts(device: torch.device, rows: int) -> dict:
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    host = torch.randn(rows, DIM).numpy()
    index = TorchFlatIndex(host, None, [device], dtype=dtype)
    values = index.shards[0][0].values
    query = torch.randn(1, DIM, device=device, dtype=dtype)
    scores32 = torch.randn(1, rows, device=device)
    copy = torch.empty_like(values)
    xq = np.random.default_rng(0).standard_normal((1, DIM), dtype=np.float32)
    timings = {
        "q @ V.T": _median_ms(lambda: query @ values.T, device),
        "V @ q.T": _median_ms(lambda: values @ query.T, device),
        "mv": _median_ms(lambda: torch.mv(values, query[0]), device),
        f"topk {DEPTH} float32": _median_ms(lambda: torch.topk(scores32, DEPTH, dim=1), device),
        f"topk {DEPTH} {str(dtype).removeprefix('torch.')}": _median_ms(
            lambda: torch.topk(scores32.to(dtype), DEPTH, dim=1), device),
        "copy of the rows": _median_ms(lambda: copy.copy_(values), device),
        "search": _median_ms(lambda: index.search(xq, DEPTH), device),
        "search k=11": _median_ms(lambda: index.search(xq, 11), device),
    }
    if device.type == "cuda":
        for k in (DEPTH, 11):
            for split in PARTS:
                timings[f"device part k={k}, graphed, {split} parts"] = _graphed_ms(index, query, device, k, split)
        timings.update(_host_side(index, xq, device, dtype))
    nbytes = values.numel() * values.element_size()
    return {"device": str(device), "rows": rows, "dtype": str(dtype).removeprefix("torch."),
            "ms": {name: round(ms, 4) for name, ms in timings.items()},
            "share_of_search": {name: round(ms / timings["search"], 3) for name, ms in timings.items()},
            "copy_gbps": round(2 * nbytes / timings["copy of the rows"] / 1e6, 1),
            "split_chosen": {k: choice["parts"] for k, choice in index.graphed[0].choices().items()},
            "search_scan_gbps": round(nbytes / timings["search"] / 1e6, 1)}


if __name__ == "__main__":
    name = (sys.argv[1] if len(sys.argv) > 1 else "") or ("cuda" if torch.cuda.is_available() else "cpu")
    print(json.dumps(parts(torch.device(name), int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000), indent=1))
