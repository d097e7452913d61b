"""FedCor's private GP: structure, likelihood, fitting and the low-rank greedy selection."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import torch
from linear_operator.operators import LowRankRootAddedDiagLinearOperator, LowRankRootLinearOperator

from fedselect.selectors import _gp


def make_gp(n_clients: int = 9, rank: int = 3, noise: float = 0.01, seed: int = 0) -> _gp.LossChangeGP:
    return _gp.LossChangeGP(n_clients, rank, noise, generator=torch.Generator().manual_seed(seed))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """tr(A^T B) / (||A||_F ||B||_F), the paper's covariance similarity (Fig. 3)."""
    return float(np.sum(a * b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def group_covariance(sizes: list[int], scales: list[float], noise: float, rng: np.random.Generator) -> np.ndarray:
    """A known low-rank + diagonal covariance: clients of one group share one latent factor."""
    n = sum(sizes)
    loadings = np.zeros((n, len(sizes)))
    start = 0
    for g, (size, scale) in enumerate(zip(sizes, scales)):
        loadings[start : start + size, g] = scale * rng.uniform(0.7, 1.3, size)
        start += size
    return loadings @ loadings.T + noise**2 * np.eye(n)


# -- structure and likelihood -------------------------------------------------------------
def test_covariance_operator_keeps_low_rank_plus_diagonal_structure():
    gp = make_gp()
    covar = gp().lazy_covariance_matrix
    assert type(covar) is LowRankRootAddedDiagLinearOperator
    assert isinstance(covar._linear_op, LowRankRootLinearOperator)
    assert covar._linear_op.root.shape == (9, 3)
    np.testing.assert_allclose(covar.to_dense().detach().numpy(), gp.dense_covariance(), atol=1e-12)


def test_embeddings_start_from_normal_with_variance_one_over_rank():
    gp = make_gp(n_clients=4000, rank=15)
    x = gp.embeddings
    assert x.shape == (15, 4000)
    assert abs(x.mean()) < 0.01
    assert abs(x.var() - 1 / 15) < 0.005
    np.testing.assert_array_equal(x, make_gp(n_clients=4000, rank=15).embeddings)  # seeded generator


@pytest.mark.parametrize("with_mean", [False, True])
def test_log_probs_equal_dense_scipy_logpdf(with_mean):
    rng = np.random.default_rng(1)
    gp = make_gp(n_clients=7, rank=3)
    values = rng.normal(scale=0.3, size=(4, 7))
    weights = 0.9 ** np.arange(4)[::-1]
    if with_mean:
        gp.set_mean(values, weights)
        mean = weights @ values / weights.sum()
    else:
        mean = np.zeros(7)
    dense = scipy.stats.multivariate_normal(mean, gp.dense_covariance())
    expected = dense.logpdf(values)
    with torch.no_grad():
        got = gp.log_probs(torch.from_numpy(values)).numpy()
        single = gp().log_prob(torch.from_numpy(values[2])).item()
        nll = gp.weighted_nll(torch.from_numpy(values), torch.from_numpy(weights)).item()
    np.testing.assert_allclose(got, expected, rtol=1e-10)
    assert single == pytest.approx(expected[2], rel=1e-10)
    assert nll == pytest.approx(-(weights * expected).sum(), rel=1e-10)


def test_gradient_equals_dense_torch_gradient():
    rng = np.random.default_rng(2)
    values = torch.from_numpy(rng.normal(scale=0.2, size=(3, 8)))
    weights = torch.tensor([0.81, 0.9, 1.0], dtype=torch.float64)
    gp = make_gp(n_clients=8, rank=3)
    gp.weighted_nll(values, weights).backward()
    root = gp.root.detach().clone().requires_grad_()
    cov = root @ root.T + 0.01**2 * torch.eye(8, dtype=torch.float64)
    dense = torch.distributions.MultivariateNormal(torch.zeros(8, dtype=torch.float64), covariance_matrix=cov)
    (-(weights * dense.log_prob(values)).sum()).backward()
    torch.testing.assert_close(gp.root.grad, root.grad, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("with_mean", [False, True])
def test_closed_form_objective_equals_gpytorch(with_mean):
    """The hand-written Woodbury objective: GPyTorch's value and gradient, complete and partial vectors alike."""
    rng = np.random.default_rng(5)
    gp = make_gp(n_clients=30, rank=4, noise=0.05)
    values = rng.normal(scale=0.3, size=(5, 30))
    values[1, [3, 7]] = np.nan  # clients that did not answer
    weights = 0.9 ** np.arange(5)[::-1]
    if with_mean:
        gp.set_mean(values, weights)
    v, w = torch.from_numpy(values), torch.from_numpy(weights)
    expected = gp.weighted_nll(v, w)
    (g_expected,) = torch.autograd.grad(expected, gp.root)
    got, g_got = gp.closed_form_objective(v, w)()
    assert got.item() == pytest.approx(expected.item(), rel=1e-12)
    torch.testing.assert_close(g_got, g_expected, rtol=1e-10, atol=1e-12)
    for rows in ([0, 2], [1]):  # only complete vectors (the closed-form gradient), only a partial one (autograd)
        value, grad = gp.closed_form_objective(v[rows], w[rows])()
        ref = gp.weighted_nll(v[rows], w[rows])
        (g_ref,) = torch.autograd.grad(ref, gp.root)
        assert value.item() == pytest.approx(ref.item(), rel=1e-12)
        torch.testing.assert_close(grad, g_ref, rtol=1e-10, atol=1e-12)


def test_closed_form_fit_follows_the_gpytorch_fit():
    rng = np.random.default_rng(6)
    values = rng.normal(scale=0.2, size=(3, 40))
    weights = np.array([0.81, 0.9, 1.0])
    a, b = make_gp(n_clients=40, rank=5), make_gp(n_clients=40, rank=5)
    ra = a.fit(values, weights, iterations=60, lr=0.01)
    rb = b.fit(values, weights, iterations=60, lr=0.01, solver="closed-form")
    np.testing.assert_allclose(b.embeddings, a.embeddings, rtol=1e-9, atol=1e-12)
    assert rb.nll == pytest.approx(ra.nll, rel=1e-10) and rb.initial_nll == pytest.approx(ra.initial_nll, rel=1e-12)
    with pytest.raises(ValueError, match=r"LossChangeGP.fit: solver='dense'; expected one of"):
        a.fit(values, weights, iterations=1, lr=0.01, solver="dense")


def test_large_federation_never_forms_dense_matrix():
    # N x N at N = 60,000 would need 29 GB: this only runs if nothing densifies.
    n = 60_000
    gp = make_gp(n_clients=n, rank=15)
    values = np.random.default_rng(0).normal(scale=0.1, size=(2, n))
    result = gp.fit(values, np.array([0.9, 1.0]), iterations=3, lr=0.01)
    assert np.isfinite(result.nll)
    assert np.isfinite(gp.fit(values, np.array([0.9, 1.0]), iterations=3, lr=0.01, solver="closed-form").nll)
    chosen = _gp.greedy_select(gp.embeddings, 0.01, np.full(n, 1 / n), np.ones(n), 10)
    assert len(set(chosen.tolist())) == 10


# -- fitting ------------------------------------------------------------------------------
def test_fit_recovers_known_group_covariance():
    # s_n = 0.1 here: with s_n = 0.01 the likelihood's valley is 0.01 wide in X, and Adam at
    # lr 0.01 needs thousands of steps to rotate X onto the groups (the fit is right, only slow).
    rng = np.random.default_rng(0)
    sizes, noise = [6, 6, 6, 6], 0.1
    truth = group_covariance(sizes, [0.3, 0.2, 0.25, 0.15], noise, rng)
    values = rng.multivariate_normal(np.zeros(len(truth)), truth, size=100)
    gp = make_gp(n_clients=len(truth), rank=4, noise=noise, seed=3)
    before = cosine(gp.dense_covariance(), truth)
    for _ in range(4):  # warm-started fits with a fresh Adam each, as the selector runs them
        result = gp.fit(values, np.ones(len(values)), iterations=200, lr=0.01)
    after = cosine(gp.dense_covariance(), truth)
    print(f"cosine similarity of fitted and true covariance: {before:.3f} at init -> {after:.3f} after 4 x 200 steps")
    assert after > 0.95
    assert result.iterations == 200 and result.seconds > 0
    # the first picks come from different groups (Lemma 2: correlated with many, not with each other)
    groups = np.repeat(np.arange(len(sizes)), sizes)
    chosen = _gp.greedy_select(gp.embeddings, noise, np.full(len(truth), 1 / len(truth)), np.ones(len(truth)), 4)
    assert sorted(groups[chosen].tolist()) == [0, 1, 2, 3]


def test_fit_warm_starts_and_decreases_the_objective():
    rng = np.random.default_rng(4)
    values = rng.normal(scale=0.2, size=(3, 10))
    weights = np.array([0.81, 0.9, 1.0])
    gp = make_gp(n_clients=10)
    x0 = gp.embeddings
    zero = gp.fit(values, weights, iterations=0, lr=0.01)
    np.testing.assert_array_equal(gp.embeddings, x0)
    short = gp.fit(values, weights, iterations=20, lr=0.01)
    x1 = gp.embeddings
    longer = gp.fit(values, weights, iterations=200, lr=0.01)
    assert zero.nll > short.nll > longer.nll
    # warm start: 20 steps at lr 0.01 move each coordinate by at most about 0.2
    assert np.abs(x1 - x0).max() < 0.25


@pytest.mark.parametrize("constant", [0.0, -0.3])
def test_constant_vectors_do_not_break_the_fit(constant):
    gp = make_gp(n_clients=12, rank=3)
    values = np.full((3, 12), constant)
    for update_mean in (False, True):
        weights = np.ones(3)
        if update_mean:
            gp.set_mean(values, weights)
        result = gp.fit(values, weights, iterations=50, lr=0.01)
        assert np.isfinite(result.nll)
        assert np.all(np.isfinite(gp.embeddings))
    np.testing.assert_allclose(gp.mean.numpy(), constant)
    gp.set_mean(None)
    assert not gp.mean.any()


def test_threads_are_restored_after_a_fit():
    before = torch.get_num_threads()
    make_gp().fit(np.zeros((1, 9)), np.ones(1), iterations=2, lr=0.01)
    assert torch.get_num_threads() == before


# -- selection: the low-rank form equals Algorithm 1 on a dense matrix ------------------
def dense_algorithm1(embeddings, noise, p, alpha, n, *, posterior_noise=False, mu=None):
    """Algorithm 1 as printed (Eqs. 9-11), on dense matrices.

    Each iteration predicts ``dl_k = mu_k - alpha_k sigma_k`` for every remaining k, takes the
    posterior mean given that prediction, and picks the k minimising ``sum_i p_i mu~_i``.
    With ``posterior_noise`` the prediction is observed with noise s_n^2 and Sigma starts
    noise-free (the official 2022 code).
    """
    X = np.asarray(embeddings, dtype=np.float64)
    n_clients = X.shape[1]
    s2 = noise**2
    sigma = X.T @ X + (0.0 if posterior_noise else s2) * np.eye(n_clients)
    mu = np.zeros(n_clients) if mu is None else np.array(mu, dtype=np.float64)
    obs = s2 if posterior_noise else 0.0
    remaining = list(range(n_clients))
    chosen = []
    for _ in range(n):
        best, best_value = None, np.inf
        for k in remaining:
            pred = mu[k] - alpha[k] * np.sqrt(sigma[k, k])
            post_mean = mu + sigma[:, k] / (sigma[k, k] + obs) * (pred - mu[k])
            value = p @ post_mean
            if best is None or value < best_value:
                best, best_value = k, value
        k = best
        pred = mu[k] - alpha[k] * np.sqrt(sigma[k, k])
        mu = mu + sigma[:, k] / (sigma[k, k] + obs) * (pred - mu[k])
        sigma = sigma - np.outer(sigma[:, k], sigma[k, :]) / (sigma[k, k] + obs)
        chosen.append(k)
        remaining.remove(k)
    return np.array(chosen)


@pytest.mark.parametrize("posterior_noise", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_low_rank_selection_equals_dense_algorithm1(seed, posterior_noise):
    rng = np.random.default_rng(seed)
    n_clients, rank, n = 25, 4, 8
    X = rng.normal(scale=0.2, size=(rank, n_clients))
    p = rng.dirichlet(np.ones(n_clients))
    alpha = 0.95 ** rng.integers(0, 4, n_clients)  # annealed clients
    mu = rng.normal(scale=0.1, size=n_clients)  # mu shifts every candidate equally: same choice
    got = _gp.greedy_select(X, 0.05, p, alpha, n, posterior_noise=posterior_noise)
    expected = dense_algorithm1(X, 0.05, p, alpha, n, posterior_noise=posterior_noise, mu=mu)
    np.testing.assert_array_equal(got, expected)
    assert len(set(got.tolist())) == n


def test_selection_beyond_rank_still_picks_distinct_clients():
    rng = np.random.default_rng(7)
    X = rng.normal(size=(2, 12))
    got = _gp.greedy_select(X, 0.01, np.full(12, 1 / 12), np.ones(12), 12)
    np.testing.assert_array_equal(np.sort(got), np.arange(12))
    np.testing.assert_array_equal(got, dense_algorithm1(X, 0.01, np.full(12, 1 / 12), np.ones(12), 12))


@pytest.mark.parametrize("seed", range(5))
def test_first_two_picks_follow_lemma2(seed):
    """Eqs. (12)-(13): k1 = argmax beta^tau_k sum_i p_i sigma_i r_ik, and k2 penalises r_{k1 k'}."""
    rng = np.random.default_rng(10 + seed)
    n_clients, noise = 15, 0.01
    X = rng.normal(scale=0.3, size=(3, n_clients))
    p = rng.dirichlet(np.ones(n_clients))
    alpha = 0.9 ** rng.integers(0, 3, n_clients)
    sigma = X.T @ X + noise**2 * np.eye(n_clients)
    sd = np.sqrt(np.diag(sigma))
    r = sigma / np.outer(sd, sd)
    single = (p * sd) @ r  # sum_i p_i sigma_i r_ik for every k
    k1 = int(np.argmax(alpha * single))
    crit2 = alpha * (single - r[k1] * single[k1]) / np.sqrt(np.maximum(1 - r[k1] ** 2, 1e-300))
    crit2[k1] = -np.inf
    k2 = int(np.argmax(crit2))
    np.testing.assert_array_equal(_gp.greedy_select(X, noise, p, alpha, 2), [k1, k2])
