"""``bench --scale-fit-components``: distractors drawn from a tied-covariance Gaussian mixture of the real rows."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from densehybrid.bench.scale import vectors as scale_vectors
from densehybrid.cli.main import app

TRUE_MEANS = np.array([[6.0, 0, 0, 0, 0], [0, 6.0, 0, 0, 0], [0, 0, -6.0, 1.0, 0]])
TRUE_WEIGHTS = np.array([0.5, 0.3, 0.2])
TRUE_ROOT = np.diag([1.0, 0.8, 0.6, 0.4, 0.2])


def _toy_mixture(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, 5) rows of three separated components sharing one covariance, and each row's component."""
    rng = np.random.default_rng(seed)
    picked = rng.choice(3, n, p=TRUE_WEIGHTS)
    return TRUE_MEANS[picked] + rng.standard_normal((n, 5)) @ TRUE_ROOT.T, picked


def _unit_rows(n: int, dim: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim)) + np.repeat(np.eye(dim)[:4] * 3, n // 4 + 1, 0)[:n]
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_a_fitted_mixture_recovers_the_means_weights_and_shared_covariance_of_a_toy_mixture():
    real, _ = _toy_mixture(6000, seed=0)
    means, weights, root = scale_vectors.fit_mixture(real, 3, seed=1)
    order = [int(np.argmin(np.linalg.norm(means - m, axis=1))) for m in TRUE_MEANS]
    assert sorted(order) == [0, 1, 2]
    np.testing.assert_allclose(means[order], TRUE_MEANS, atol=0.1)
    np.testing.assert_allclose(weights[order], TRUE_WEIGHTS, atol=0.02)
    np.testing.assert_allclose(root @ root.T, TRUE_ROOT @ TRUE_ROOT.T, atol=0.08)


def test_mixture_distractors_fall_into_the_components_in_proportion_to_their_sizes():
    real, _ = _toy_mixture(3000, seed=2)
    drawn = scale_vectors.passages(33_000, 5, seed=3, fit=real, components=3)[3000:]
    nearest = np.argmin(((drawn[:, None, :] - TRUE_MEANS[None]) ** 2).sum(-1), axis=1)
    np.testing.assert_allclose(np.bincount(nearest, minlength=3) / len(drawn), TRUE_WEIGHTS, atol=0.02)
    within = drawn - TRUE_MEANS[nearest]
    np.testing.assert_allclose(np.cov(within, rowvar=False), TRUE_ROOT @ TRUE_ROOT.T, atol=0.08)


def test_mixture_rows_keep_the_real_ones_first_are_unit_length_and_repeat_by_seed():
    real = _unit_rows(800, 12, seed=4)
    a = scale_vectors.passages(5000, 12, seed=5, fit=real, components=8)
    assert a.shape == (5000, 12) and a.dtype == np.float32
    np.testing.assert_array_equal(a[:800], real)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(a, scale_vectors.passages(5000, 12, seed=5, fit=real, components=8))
    assert not np.array_equal(a[800:], scale_vectors.passages(5000, 12, seed=6, fit=real, components=8)[800:])


def test_one_component_is_the_plain_gaussian_draw():
    real = _unit_rows(700, 6, seed=7)
    got = scale_vectors.passages(3000, 6, seed=8, fit=real, components=1)
    rng = np.random.default_rng(8)  # the draw written out with numpy alone: mean + L z, L L^T = cov
    w, v = np.linalg.eigh(np.cov(real.astype(np.float64), rowvar=False))
    x = real.astype(np.float64).mean(0) + rng.standard_normal((2300, 6)) @ (v * np.sqrt(np.clip(w, 0, None))).T
    np.testing.assert_allclose(got[700:], x / np.linalg.norm(x, axis=1, keepdims=True), atol=1e-6)
    np.testing.assert_array_equal(got, scale_vectors.passages(3000, 6, seed=8, fit=real))


@pytest.mark.parametrize("components", [0, 701])
def test_a_mixture_needs_between_one_component_and_one_per_real_row(components):
    with pytest.raises(ValueError, match="components must be in 1..700"):
        scale_vectors.fit_mixture(_unit_rows(700, 6, seed=9), components, seed=0)


def test_bench_scale_draws_mixture_distractors_when_asked(tmp_path):
    fit, out = tmp_path / "real.npy", tmp_path / "scale.json"
    np.save(fit, _unit_rows(600, 16, seed=10))
    result = CliRunner().invoke(app, ["bench", "--scale", "3000", "--scale-dim", "16", "--scale-fit", str(fit),
                                      "--scale-fit-components", "6", "--out", str(out), "--threads", "1",
                                      "--no-scale-serve"])
    assert result.exit_code == 0, result.output
    (run,) = json.loads(out.read_text())
    assert run["vectors"].startswith("600 real vectors + 6-component Gaussian-mixture-fitted distractors")
    assert run["flat"]["recall_at_10"] >= 0.99 and run["hnsw_sweep"]
