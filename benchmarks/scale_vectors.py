"""Seeded vectors for the scale benchmark: passages and queries of N rows, drawn to look like embeddings.

Two sources. Without real vectors: rows around a few hundred centres in a low-dimensional subspace
mapped into ``dim`` dims, plus noise (embeddings cluster by topic and span few directions; uniform
noise in every dim would be the worst case for a graph index and unlike any model). With real
vectors (``fit``: an (M, dim) .npy of real passage vectors): those rows first, then distractors drawn
from a Gaussian with their mean and covariance, L2-normalised when the real rows are.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

_CHUNK = 65_536


def _clustered_chunks(n: int, dim: int, seed: int, draws: int, centers: int = 256, latent: int = 64
                      ) -> Iterator[np.ndarray]:
    """Rows of the space ``seed`` fixes (subspace and centres), drawn by the generator seeded ``draws``."""
    shape_rng = np.random.default_rng(seed)
    basis = shape_rng.standard_normal((latent, dim)) / np.sqrt(latent)
    middle = shape_rng.standard_normal((centers, latent)) * 1.5
    rng = np.random.default_rng(draws)
    for s in range(0, n, _CHUNK):
        m = min(_CHUNK, n - s)
        z = middle[rng.integers(0, centers, m)] + rng.standard_normal((m, latent))
        yield (z @ basis + 0.3 * rng.standard_normal((m, dim))).astype(np.float32)


def _fitted_chunks(real: np.ndarray, n: int, seed: int) -> Iterator[np.ndarray]:
    real = np.asarray(real, dtype=np.float64)
    unit = bool(np.allclose(np.linalg.norm(real, axis=1), 1.0, atol=1e-3))
    mean, cov = real.mean(0), np.cov(real, rowvar=False)
    w, v = np.linalg.eigh(cov)
    root = v * np.sqrt(np.clip(w, 0, None))  # x = mean + root @ z has the fitted covariance
    rng = np.random.default_rng(seed)
    yield real[:n].astype(np.float32)
    for s in range(len(real), n, _CHUNK):
        x = mean + rng.standard_normal((min(_CHUNK, n - s), len(mean))) @ root.T
        yield (x / np.linalg.norm(x, axis=1, keepdims=True) if unit else x).astype(np.float32)


def passages(n: int, dim: int, seed: int = 0, fit: np.ndarray | None = None) -> np.ndarray:
    """(n, dim) float32 passage vectors (see the module docstring for the two sources)."""
    chunks = _clustered_chunks(n, dim, seed, draws=seed + 1) if fit is None else _fitted_chunks(fit, n, seed)
    out = np.concatenate(list(chunks))
    if out.shape != (n, dim):
        raise ValueError(f"drew {out.shape}, expected {(n, dim)} (real vectors of another dim?)")
    return out


def queries(q: int, dim: int, seed: int = 0) -> np.ndarray:
    """(q, dim) float32 queries from the clustered source (the space of :func:`passages`, other draws)."""
    return np.concatenate(list(_clustered_chunks(q, dim, seed, draws=seed + 2)))
