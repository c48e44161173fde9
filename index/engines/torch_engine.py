"""The torch engine: exact first stage, exact GIP and per-part rerank, on any device torch supports.

This is the GPU path: an exact inner product (matmul + top-k) runs on every GPU the installed
torch supports, needs no Faiss GPU build (the faiss-gpu-cu12 wheels carry no sm_90 kernels and
abort the process on Hopper) and has no k limit (Faiss GPU caps k at 2048; K1 goes to 10,000).
The same code runs on CPU, which is how CI tests it.

Layout: the index rows are split evenly over ``devices`` (one slice per GPU; the per-device
top-k lists are merged on the host), and each device's slice is stored as chunks of at most
``chunk_rows`` rows, so no single allocation has to hold a whole index. Rows keep their global
numbers, so results are comparable with Faiss and with :mod:`densehybrid.index.search.gip`.

The normalised fusion scores each part of the candidates here too, so a GPU index never
reads candidate rows on the host; only the (Q, K) part scores come back to be normalised.

Arrays in, arrays out: numpy at the edges (the searcher's types), torch inside.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from densehybrid.encoder.device import to_host
from densehybrid.index.engines.host import HostRows
from densehybrid.index.engines.torch_graphs import GraphedTopK, top_k_over_chunks
from densehybrid.index.search.filters import Selection
from densehybrid.index.search.gip import sort_by_score
from densehybrid.index.search.vector_store import VectorStore

DEFAULT_CHUNK_ROWS = 1 << 20  # 1M rows x 896 fp16 values = 1.8 GB per allocation
_RERANK_BLOCK = 16_384  # candidate rows gathered per scoring step


@dataclass
class _Chunk:
    start: int  # global number of the first row
    values: torch.Tensor  # (rows, dim) in the storage dtype
    gates: torch.Tensor | None  # (rows, G) uint8


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous row ranges covering 0..n, sizes differing by at most one."""
    bounds = np.linspace(0, n, parts + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


class TorchFlatIndex:
    """Index values (and gates) resident on torch devices; exact search and rerank there.

    values (N, dim) float16/float32 (a memory map is fine: it is copied once), gates (N, G)
    uint8 or None, devices: where the rows live (several entries split the rows), dtype: the
    storage type on the devices (float16 halves memory and bandwidth; scores accumulate in
    float32 either way on CUDA; on CPU use float32).
    """

    def __init__(self, values: np.ndarray, gates: np.ndarray | None, devices: Sequence[str | torch.device], *,
                 dtype: torch.dtype = torch.float32, chunk_rows: int = DEFAULT_CHUNK_ROWS):
        if not devices:
            raise ValueError("TorchFlatIndex needs at least one device")
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        self.count, self.dim = values.shape
        self.gated_dim = 0 if gates is None else gates.shape[1]
        self.dtype = dtype
        self.devices = [torch.device(d) for d in devices]
        self.shards: list[list[_Chunk]] = []
        for device, (lo, hi) in zip(self.devices, _split(self.count, len(self.devices))):
            chunks = []
            for start in range(lo, hi, chunk_rows):
                stop = min(hi, start + chunk_rows)
                # copies: the index files are read-only memory maps
                chunk_values = torch.from_numpy(np.array(values[start:stop])).to(device, dtype)
                chunk_gates = None if gates is None else torch.from_numpy(np.array(gates[start:stop])).to(device)
                chunks.append(_Chunk(start, chunk_values, chunk_gates))
            self.shards.append(chunks)
        # per device, the batch-1 first stage replayed from CUDA graphs (off on a CPU)
        self.graphed = [GraphedTopK([c.values for c in chunks], [c.start for c in chunks]) for chunks in self.shards]

    @torch.inference_mode()
    def search(self, xq: np.ndarray, k: int, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Exact inner product: xq (Q, dim) float32 -> scores (Q, k') float32, rows (Q, k') int64,
        k' = min(k, N), sorted by score descending, ties by row ascending. ``mask`` (N,) bool keeps
        only those rows: the others score -inf on the device, before the top-k, and come back as -1."""
        k = min(k, self.count)
        # each device's top k crosses to the host in one wait; the host orders them (on an H200, sorting
        # 1,000 rows on the device took longer than the copy and a numpy sort)
        found = [self._search_on(device, chunks, graphed, xq, k, mask)
                 for device, chunks, graphed in zip(self.devices, self.shards, self.graphed) if chunks]
        scores = np.concatenate([part_scores for part_scores, _ in found], 1)
        rows = np.concatenate([part_rows for _, part_rows in found], 1)
        scores, rows = sort_by_score(scores, rows, k)
        if mask is not None:
            rows = np.where(np.isneginf(scores), -1, rows)
        return scores, rows

    def _search_on(self, device: torch.device, chunks: list[_Chunk], graphed: GraphedTopK, xq: np.ndarray, k: int,
                   mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """One device's top ``k`` (unordered) -> (scores float32, global rows) on the host."""
        xq = np.ascontiguousarray(xq, dtype=np.float32)
        depth = min(k, sum(chunk.values.shape[0] for chunk in chunks))
        if mask is None and graphed.fits(len(xq), depth):
            replayed = graphed(xq, depth)
            if replayed is not None:
                return replayed[0], replayed[1]
        q = torch.from_numpy(xq).to(device, self.dtype)
        masks = None if mask is None else [
            torch.from_numpy(np.array(mask[c.start:c.start + c.values.shape[0]])).to(device) for c in chunks]
        scores, rows = to_host(*top_k_over_chunks(q, [c.values for c in chunks], [c.start for c in chunks], k,
                                                  masks=masks))
        return scores, rows

    @torch.inference_mode()
    def rerank(self, xq: np.ndarray, gq: np.ndarray | None, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact GIP of each query's candidate rows, top ``k`` (as :func:`densehybrid.index.search.gip.rerank`).

        xq (Q, dim) float32 (λ-scaled), gq (Q, G) uint8 or None, rows (Q, K) int64 (-1 = none)
        -> (scores, rows) (Q, min(k, K)).
        """
        if len(self.devices) > 1:
            return sort_by_score(self.score_rows(xq, gq, rows)[0], rows, k)
        # scored where the rows live, and only the best k + 1 come back: the one past the cut shows a run
        # of equal scores through the cut, the one case where every score is needed to pick the lowest rows
        scores = self._device_scores(self.devices[0], self.shards[0], xq, gq, rows, split=False)[0]
        kept = min(k, rows.shape[1])
        probe = min(kept + 1, rows.shape[1])
        best, columns = to_host(*torch.topk(scores, probe, dim=1))
        if probe > kept and kept and (np.isfinite(best[:, kept - 1]) & (best[:, kept] == best[:, kept - 1])).any():
            return sort_by_score(scores.cpu().numpy(), rows, k)
        return sort_by_score(best[:, :kept], np.take_along_axis(rows, columns[:, :kept], 1), k)

    @torch.inference_mode()
    def score_rows(self, xq: np.ndarray, gq: np.ndarray | None, rows: np.ndarray, *,
                   split: bool = False) -> np.ndarray:
        """Exact GIP of the candidate ``rows`` (Q, K) -> (1, Q, K) float32, or with ``split`` (2, Q, K):
        the gated part and the open part apart. Each candidate is scored on the device holding its
        row; cells where ``rows`` is -1 hold -inf."""
        out = np.full((2 if split else 1, *rows.shape), -np.inf, dtype=np.float32)
        for device, chunks, (lo, hi) in zip(self.devices, self.shards, _split(self.count, len(self.devices))):
            here = (rows >= lo) & (rows < hi)
            if here.any():
                scored = self._device_scores(device, chunks, xq, gq, rows, split=split).cpu().numpy()
                out[:, here] = scored[:, here]
        return out

    def _device_scores(self, device: torch.device, chunks: list[_Chunk], xq: np.ndarray, gq: np.ndarray | None,
                       rows: np.ndarray, *, split: bool) -> torch.Tensor:
        """Exact GIP of the candidates held in ``chunks`` -> (1 or 2, Q, K) float32 on ``device``; -inf elsewhere."""
        q = torch.from_numpy(np.ascontiguousarray(xq, dtype=np.float32)).to(device).unsqueeze(2)  # (Q, dim, 1)
        g = None if gq is None or not self.gated_dim else torch.from_numpy(np.ascontiguousarray(gq)).to(device)
        wanted = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64)).to(device)
        out = torch.full((2 if split else 1, *rows.shape), float("-inf"), device=device)
        per_step = max(1, _RERANK_BLOCK // max(1, rows.shape[1]))  # queries whose candidates one step gathers
        gated = self.gated_dim
        for chunk in chunks:
            if chunk.values.shape[0] == self.count:  # holds every row: only the padding (-1) is outside
                inside, local = wanted >= 0, wanted.clamp(min=0)
            else:
                local = wanted - chunk.start
                inside = (local >= 0) & (local < chunk.values.shape[0])
                local.clamp_(0, chunk.values.shape[0] - 1)
            for s in range(0, rows.shape[0], per_step):
                block = slice(s, s + per_step)
                found = self._gated_rows(g, chunk, local[block], block)  # (B, K, dim) float32
                parts = (found[..., :gated] @ q[block, :gated], found[..., gated:] @ q[block, gated:]) if split \
                    else (found @ q[block],)
                for i, part in enumerate(parts):
                    out[i, block] = torch.where(inside[block], part.squeeze(2), out[i, block])
        return out

    def _gated_rows(self, g: torch.Tensor | None, chunk: _Chunk, local: torch.Tensor, block: slice) -> torch.Tensor:
        """The candidate rows local (B, K) in float32 (B, K, dim), their gated dims zeroed where the row's gate
        differs from the query's: a product with the query is then their exact GIP."""
        flat = local.reshape(-1)
        found = chunk.values.index_select(0, flat).float().view(*local.shape, self.dim)
        if g is not None and chunk.gates is not None:
            same_gate = chunk.gates.index_select(0, flat).view(*local.shape, self.gated_dim) == g[block].unsqueeze(1)
            found[..., :self.gated_dim] *= same_gate
        return found


class TorchStore(HostRows, VectorStore):
    """A local index (its rows as :class:`HostRows` takes them) resident on torch ``devices`` (several entries
    split the rows; see :func:`search_devices`); ``float16`` stores the rows as float16 on the devices (use
    float32 on the CPU)."""

    first_stage = "flat"  # an exact scan, whatever first stage the index files also hold

    def __init__(self, values: np.ndarray, gates: np.ndarray | None, doc_ids: Sequence[str],
                 devices: Sequence[str | torch.device], *, float16: bool = False, chunk_rows: int = DEFAULT_CHUNK_ROWS):
        super().__init__(values, gates, doc_ids)
        self.resident = TorchFlatIndex(values, gates, devices, chunk_rows=chunk_rows,
                                       dtype=torch.float16 if float16 else torch.float32)

    def inner_product(self, xq: np.ndarray, depth: int, selection: Selection | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
        return self.resident.search(xq, depth, None if selection is None else selection.mask)

    def rerank(self, xq: np.ndarray, gq: np.ndarray | None, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.resident.rerank(xq, gq, rows, k)

    def part_scores(self, xq: np.ndarray, gq: np.ndarray | None, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lexical, dense = self.resident.score_rows(xq, gq, rows, split=True)
        return lexical, dense


def search_devices(device: str) -> list[str]:
    """``"cuda"`` -> every visible GPU; ``"cuda:N"`` or ``"cpu"`` -> that one device."""
    if device == "cuda":
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return [device]
