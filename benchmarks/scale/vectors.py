"""Seeded vectors for the scale benchmark: passages and queries of N rows, drawn to look like embeddings.

Two sources. Without real vectors: rows around a few hundred centres in a low-dimensional subspace
mapped into ``dim`` dims, plus noise (embeddings cluster by topic and span few directions; uniform
noise in every dim would be the worst case for a graph index and unlike any model). With real
vectors (``fit``: an (M, dim) .npy of real passage vectors): those rows first, then distractors drawn
from a tied-covariance Gaussian mixture fitted to them, L2-normalised when the real rows are. Its
``components`` are the k-means clusters of the real rows (weights their sizes, one covariance pooled
within them); one component is the plain Gaussian with their mean and covariance, which has none of the
topical clusters real embeddings have and so is near the worst case for an approximate first stage.
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


def clustered_chunks_on(device: str, n: int, dim: int, seed: int = 0, chunk: int = 1 << 20, centers: int = 256,
                        latent: int = 64) -> Iterator[np.ndarray]:
    """The clustered rows of :func:`passages` drawn by torch on ``device``, as float16 chunks on the host: the
    same shape (``centers`` centres in a ``latent``-dim subspace, noise 0.3), other draws. A GPU draws 8.8M x
    768 in seconds where numpy takes minutes; the rows still cross to the host, since they are written."""
    import torch

    generator = torch.Generator(device=device).manual_seed(seed)
    basis = torch.randn((latent, dim), generator=generator, device=device) / latent ** 0.5
    middle = torch.randn((centers, latent), generator=generator, device=device) * 1.5
    for s in range(0, n, chunk):
        m = min(chunk, n - s)
        picked = torch.randint(0, centers, (m,), generator=generator, device=device)
        z = middle[picked] + torch.randn((m, latent), generator=generator, device=device)
        rows = z @ basis + 0.3 * torch.randn((m, dim), generator=generator, device=device)
        yield rows.to(torch.float16).cpu().numpy()


def fit_mixture(real: np.ndarray, components: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A tied-covariance Gaussian mixture of ``real`` (M, dim): means (C, dim), weights (C,) summing to 1,
    and root (dim, dim) with ``root @ root.T`` the covariance pooled within the k-means clusters."""
    real = np.asarray(real, dtype=np.float64)
    if not 1 <= components <= len(real):
        raise ValueError(f"mixture components must be in 1..{len(real)} (the real rows), got {components}")
    labels = np.zeros(len(real), dtype=np.int64) if components == 1 else _kmeans_labels(real, components, seed)
    counts = np.bincount(labels, minlength=components)
    means = np.stack([real[labels == c].mean(0) if counts[c] else real.mean(0) for c in range(components)])
    if components == 1:  # numpy's own covariance, so that draws made before mixtures existed repeat bit for bit
        cov = np.cov(real, rowvar=False)
    else:
        residual = real - means[labels]
        cov = residual.T @ residual / (len(real) - components)
    w, v = np.linalg.eigh(cov)
    return means, counts / counts.sum(), v * np.sqrt(np.clip(w, 0, None))


def _kmeans_labels(real: np.ndarray, components: int, seed: int) -> np.ndarray:
    import faiss

    kmeans = faiss.Kmeans(real.shape[1], components, niter=25, seed=seed, max_points_per_centroid=len(real))
    xb = np.ascontiguousarray(real, dtype=np.float32)
    kmeans.train(xb)
    return kmeans.index.search(xb, 1)[1][:, 0].astype(np.int64)


def _fitted_chunks(real: np.ndarray, n: int, seed: int, components: int = 1) -> Iterator[np.ndarray]:
    unit = bool(np.allclose(np.linalg.norm(real, axis=1), 1.0, atol=1e-3))
    means, weights, root = fit_mixture(real, components, seed)
    rng = np.random.default_rng(seed)
    yield np.asarray(real[:n], dtype=np.float32)
    for s in range(len(real), n, _CHUNK):
        m = min(_CHUNK, n - s)
        picked = np.zeros(m, dtype=np.int64) if components == 1 else rng.choice(components, m, p=weights)
        x = means[picked] + rng.standard_normal((m, root.shape[0])) @ root.T
        yield (x / np.linalg.norm(x, axis=1, keepdims=True) if unit else x).astype(np.float32)


def passages(n: int, dim: int, seed: int = 0, fit: np.ndarray | None = None, components: int = 1) -> np.ndarray:
    """(n, dim) float32 passage vectors (see the module docstring for the two sources; ``components``: of
    the mixture the distractors are drawn from, with ``fit``)."""
    if fit is None:
        chunks = _clustered_chunks(n, dim, seed, draws=seed + 1)
    else:
        chunks = _fitted_chunks(fit, n, seed, components)
    out = np.concatenate(list(chunks))
    if out.shape != (n, dim):
        raise ValueError(f"drew {out.shape}, expected {(n, dim)} (real vectors of another dim?)")
    return out


def queries(q: int, dim: int, seed: int = 0) -> np.ndarray:
    """(q, dim) float32 queries from the clustered source (the space of :func:`passages`, other draws)."""
    return np.concatenate(list(_clustered_chunks(q, dim, seed, draws=seed + 2)))
