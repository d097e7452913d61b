"""FedCorSelector: Algorithm 2's schedule, the oracle questions it pays for, and what it learns."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from fedselect.selection import ClientOracle, ClientPool, Selection
from fedselect.selectors import _gp
from fedselect.selectors.fedcor import FedCorSelector, register_selectors


class GroupOracle(ClientOracle):
    """Clients in groups whose loss changes share one factor per group: ``dl = B z + noise * e``.

    ``B`` (N x k) has client k's loading on its group's factor, so the true covariance of
    every loss-change vector is ``B B^T + noise^2 I``. The loss vector advances by one such
    draw per round (:meth:`advance`); a trial returns a fresh draw without applying it.
    Every question is recorded in ``calls`` with the round it was asked in.
    """

    def __init__(self, sizes=(8, 8, 8), scales=(0.3, 0.2, 0.25), noise=0.01, seed=0):
        rng = np.random.default_rng(seed)
        self.groups = np.repeat(np.arange(len(sizes)), sizes)
        self.n_clients = int(sum(sizes))
        self.loadings = np.zeros((self.n_clients, len(sizes)))
        for g, scale in enumerate(scales):
            members = self.groups == g
            self.loadings[members, g] = scale * rng.uniform(0.7, 1.3, members.sum())
        self.noise = noise
        self.rng = rng
        self.round = 0
        self.current = 2.0 + rng.uniform(size=self.n_clients)
        self.calls: list[tuple[int, str, tuple[int, ...]]] = []

    @property
    def covariance(self) -> np.ndarray:
        return self.loadings @ self.loadings.T + self.noise**2 * np.eye(self.n_clients)

    def draw(self) -> np.ndarray:
        z = self.rng.normal(size=self.loadings.shape[1])
        return -(self.loadings @ z) + self.noise * self.rng.normal(size=self.n_clients)

    def advance(self) -> None:
        self.current = self.current + self.draw()
        self.round += 1

    def losses(self, ids: Any) -> np.ndarray:
        ids = np.asarray(ids)
        self.calls.append((self.round, "losses", tuple(ids.tolist())))
        return self.current[ids].copy()

    def trial(self, ids: Any) -> np.ndarray:
        self.calls.append((self.round, "trial", tuple(np.asarray(ids).tolist())))
        return self.draw()

    def local_updates(self, ids: Any, transform: Any = None) -> np.ndarray:
        raise AssertionError("FedCor never asks for local updates")

    def global_parameters(self) -> np.ndarray:
        raise AssertionError("FedCor never asks for the global model")


def run(selector: FedCorSelector, oracle: ClientOracle, n: int, rounds: int) -> list[np.ndarray]:
    selector.fit(ClientPool(np.full(oracle.n_clients, 50)))
    chosen = []
    for t in range(rounds):
        sel = selector.select(n, round=t, oracle=oracle)
        assert isinstance(sel, Selection)
        sel = sel.validated(oracle.n_clients, n)
        chosen.append(sel.clients)
        oracle.advance()
    return chosen


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sum(a * b) / (np.linalg.norm(a) * np.linalg.norm(b)))


FAST = dict(rank=3, warmup_iters=2, gp_iters=2)


class SpyFit:
    """Replaces LossChangeGP.fit: records the rounds of the vectors and their weights, no training."""

    def __init__(self, selector: FedCorSelector):
        self.selector = selector
        self.calls: list[dict] = []

    def __call__(self, values, weights, *, iterations, lr, solver="gpytorch"):
        history = {r.values.tobytes(): r.round for r in self.selector.history_}
        rounds = [history[v.tobytes()] for v in np.asarray(values)]
        self.calls.append(dict(rounds=rounds, weights=np.asarray(weights), iterations=iterations, lr=lr,
                               solver=solver))
        return _gp.FitResult(iterations, 0.0, 0.0)


def spied(selector: FedCorSelector, monkeypatch) -> SpyFit:
    spy = SpyFit(selector)
    original = _gp.LossChangeGP.__init__

    def init(gp, *args, **kwargs):
        original(gp, *args, **kwargs)
        gp.fit = spy

    monkeypatch.setattr(_gp.LossChangeGP, "__init__", init)
    return spy


# -- the schedule of Algorithm 2 -----------------------------------------------------------
def test_schedule_questions_and_fits(monkeypatch):
    W, dt, n = 3, 5, 4
    selector = FedCorSelector(warmup_rounds=W, gp_interval=dt, theta=0.8, warmup_history=2, history=1, **FAST)
    spy = spied(selector, monkeypatch)
    oracle = GroupOracle()
    run(selector, oracle, n, 16)
    everyone = tuple(range(oracle.n_clients))
    by_round = {t: [(kind, ids) for (r, kind, ids) in oracle.calls if r == t] for t in range(16)}
    for t in range(W + 2):  # losses of all clients at rounds 0..W+1, nothing else
        assert by_round[t] == [("losses", everyone)], t
    for t in range(W + 2, 16):
        if t % dt == 0:  # exactly one trial of n distinct clients
            assert len(by_round[t]) == 1 and by_round[t][0][0] == "trial", t
            assert len(set(by_round[t][0][1])) == n
        else:
            assert by_round[t] == [], t
    # warm-up fits: after each warm-up vector, on rounds t-1 .. t-1-M weighted theta^age
    warm = spy.calls[: W + 1]
    assert [c["rounds"] for c in warm] == [[0], [0, 1], [0, 1, 2], [1, 2, 3]]
    np.testing.assert_allclose(warm[-1]["weights"], [0.8**2, 0.8, 1.0])
    assert all(c["iterations"] == 2 and c["lr"] == 0.01 for c in warm)
    # GP rounds 5, 10, 15: the trial and the vector Dt rounds before it, weighted theta^Dt (Eq. 17)
    gp_calls = spy.calls[W + 1 :]
    assert [c["rounds"] for c in gp_calls] == [[0, 5], [5, 10], [10, 15]]
    np.testing.assert_allclose(gp_calls[0]["weights"], [0.8**5, 1.0])
    assert [r.round for r in selector.fit_log_] == [1, 2, 3, 4, 5, 10, 15]
    assert [r.kind for r in selector.fit_log_] == ["warmup"] * 4 + ["gp_round"] * 3
    assert [(r.round, r.source) for r in selector.history_][-2:] == [(10, "trial"), (15, "trial")]


@pytest.mark.parametrize(
    "history, expected",
    [
        (1, [[3, 5], [5, 10], [10, 15]]),  # the last warm-up vector (round W = 3), then the previous trial
        (2, [[2, 3, 5], [3, 5, 10], [5, 10, 15]]),
    ],
)
def test_gp_history_latest_follows_the_official_code(monkeypatch, history, expected):
    """gp_history="latest": the M + 1 newest vectors, the m-th newest weighted theta^(m Dt) whatever its round."""
    W, dt, theta = 3, 5, 0.8
    selector = FedCorSelector(
        warmup_rounds=W, gp_interval=dt, theta=theta, warmup_history=2, history=history, gp_history="latest", **FAST
    )
    spy = spied(selector, monkeypatch)
    run(selector, GroupOracle(), 4, 16)
    gp_calls = spy.calls[W + 1 :]
    assert [c["rounds"] for c in gp_calls] == expected
    for c in gp_calls:
        np.testing.assert_allclose(c["weights"], theta ** (dt * np.arange(history, -1, -1)))


def test_warmup_selection_is_uniform():
    counts = np.zeros(10)
    for seed in range(150):
        selector = FedCorSelector(warmup_rounds=3, warmup_iters=0, rank=2, random_state=seed)
        for clients in run(selector, GroupOracle(sizes=(5, 5), scales=(0.3, 0.2)), 3, 4):
            counts[clients] += 1
    expected = 150 * 4 * 3 / 10
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 27.9  # 9 degrees of freedom, p = 0.001


def test_annealing_multiplies_chosen_and_resets_at_gp_rounds():
    beta = 0.5
    selector = FedCorSelector(warmup_rounds=2, gp_interval=6, beta=beta, **FAST, random_state=0)
    oracle = GroupOracle()
    selector.fit(ClientPool(np.full(oracle.n_clients, 50)))
    expected = np.ones(oracle.n_clients)
    for t in range(13):
        sel = selector.select(3, round=t, oracle=oracle)
        if t > 2:
            if t % 6 == 0:
                expected[:] = 1.0
            np.testing.assert_array_equal(np.sort(selector.last_selection_order_), sel.clients)
            expected[sel.clients] *= beta
        np.testing.assert_allclose(selector.alpha_, expected)
        oracle.advance()
    assert (selector.alpha_ < 1).sum() == 3  # round 12 is a GP round: reset, then its 3 picks annealed


@pytest.mark.parametrize("schedule", ["paper", "readme2023"])
def test_every_selection_is_annealed_after_the_reset(monkeypatch, schedule):
    """The alpha each Algorithm-1 selection sees, as both official codes compute it.

    The 2022 and 2023 codes reset the factors at a GP round and multiply the clients of every other
    round's selection by beta, so the first selection after the reset (the one with the new GP) is
    annealed; here the reset comes before the GP round's own selection, which is therefore annealed
    too. (Leaving it alone made the next round see the same GP and all alpha = 1, and pick the same set.)
    """
    beta, W, dt = 0.5, 2, 4
    selector = FedCorSelector(warmup_rounds=W, gp_interval=dt, beta=beta, schedule=schedule, **FAST, random_state=0)
    spied(selector, monkeypatch)
    seen: list[np.ndarray] = []
    greedy = _gp.greedy_select

    def recording(x, noise, weights, alpha, n, **kwargs):
        seen.append(np.array(alpha))
        return greedy(x, noise, weights, alpha, n, **kwargs)

    monkeypatch.setattr(_gp, "greedy_select", recording)
    oracle = GroupOracle()
    chosen = run(selector, oracle, 3, 14)
    expected = np.ones(oracle.n_clients)
    for t in range(W + 1, 14):
        if t % dt == 0:
            expected[:] = 1.0
        np.testing.assert_allclose(seen[t - W - 1], expected, err_msg=f"round {t}")
        expected[chosen[t]] *= beta
    np.testing.assert_allclose(selector.alpha_, expected)
    after_gp = seen[(2 * dt + 1) - W - 1]  # round 9, right after the GP round 8
    assert np.count_nonzero(after_gp < 1) == 3


def test_readme2023_schedule(monkeypatch):
    selector = FedCorSelector(warmup_rounds=3, gp_interval=5, schedule="readme2023", **FAST)
    spy = spied(selector, monkeypatch)
    run(selector, GroupOracle(), 4, 11)
    assert [c["iterations"] for c in spy.calls] == [1000, 2, 2]  # one fit at the end of warm-up
    assert [c["rounds"] for c in spy.calls] == [[0, 1, 2, 3], [0, 1, 2, 3, 5], [0, 1, 2, 3, 5, 10]]
    np.testing.assert_allclose(spy.calls[1]["weights"], 0.95 ** np.array([5, 4, 3, 2, 0]))


class LossRecordingOracle(GroupOracle):
    """GroupOracle that also keeps every loss vector it answered, by round."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.answered: dict[int, np.ndarray] = {}

    def losses(self, ids):
        out = super().losses(ids)
        self.answered[self.round] = out.copy()
        return out


def test_warmup_vectors_are_differences_of_consecutive_losses():
    """dl^t = l(w^{t+1}) - l(w^t) of all clients, labelled t, for t = 0..W (Sec. 5.1: Dt = 1, S = 1)."""
    W = 4
    selector = FedCorSelector(warmup_rounds=W, gp_interval=50, **FAST, random_state=0)
    oracle = LossRecordingOracle()
    run(selector, oracle, 3, W + 3)
    assert sorted(oracle.answered) == list(range(W + 2))  # losses of rounds 0..W+1, then none
    warm = [r for r in selector.history_ if r.source == "warmup"]
    assert [r.round for r in warm] == list(range(W + 1))
    for r in warm:
        np.testing.assert_array_equal(r.values, oracle.answered[r.round + 1] - oracle.answered[r.round])


class TrialRecorder(FedCorSelector):
    """FedCor that also keeps, at each GP round, the trial's clients and l(w^t) of every client."""

    last_trial: np.ndarray | None = None  # the latest trial's clients, for a patched Algorithm 1

    def _fit(self, pool):
        super()._fit(pool)
        self.trial_ids_: dict[int, np.ndarray] = {}
        self.base_losses_: dict[int, np.ndarray] = {}

    def _observe_trial(self, oracle, t, ids):
        self.base_losses_[t] = np.asarray(oracle.losses(np.arange(self.n_clients_)))  # the trial asks it anyway
        self.trial_ids_[t] = ids
        type(self).last_trial = ids
        return super()._observe_trial(oracle, t, ids)


@pytest.mark.parametrize("aggregation", ["mean", "data-size"])
def test_trial_vector_is_the_loss_change_of_the_round_it_simulates(monkeypatch, aggregation):
    """A GP round's trial (Algorithm 2: S = 1 uniformly random set) trains its clients from w^t and aggregates
    them by the round's own rule (Eq. 4's plain mean on the FedCor presets) without applying the result.

    Checked on the real simulator with unequal data sizes: when the round then chooses exactly the trial's
    clients, the round's model is the trial's model, so the recorded trial vector must equal
    l(w^{t+1}) - l(w^t), measured at the next round.
    """
    from fedselect import FederatedTrainer
    from fedselect.data import make_federation

    fed = make_federation("digits", partition="dirichlet", alpha=0.5, n_clients=10, random_state=0)
    sizes = np.array([len(ix) for ix in fed.client_indices])
    assert sizes.max() > 2 * sizes.min()  # the two aggregation rules differ here
    monkeypatch.setattr(TrialRecorder, "last_trial", None)
    monkeypatch.setattr(_gp, "greedy_select", lambda *args, **kwargs: TrialRecorder.last_trial)
    trainer = FederatedTrainer(
        selector=TrialRecorder(warmup_rounds=1, gp_interval=1, **FAST, random_state=0),
        model="logistic",
        clients_per_round=3,
        rounds=5,
        local_steps=3,
        batch_size=16,
        lr=0.1,
        aggregation=aggregation,
        random_state=0,
    ).fit(fed)
    selector = trainer.selector_
    trials = {r.round: r.values for r in selector.history_ if r.source == "trial"}
    assert sorted(trials) == [2, 3, 4]  # every round after W + 1 = 2 is a GP round with Dt = 1
    for t in (2, 3):
        assert len(selector.trial_ids_[t]) == 3
        want = selector.base_losses_[t + 1] - selector.base_losses_[t]
        np.testing.assert_allclose(trials[t], want, rtol=1e-5, atol=1e-6, err_msg=f"GP round {t}")
        assert np.abs(want).max() > 1e-3  # the round moved the losses: the check is not vacuous


def test_update_mean_sets_discounted_mean():
    selector = FedCorSelector(warmup_rounds=2, update_mean=True, theta=0.5, **FAST)
    oracle = GroupOracle()
    run(selector, oracle, 3, 4)
    vectors = [r.values for r in selector.history_]
    w = 0.5 ** np.arange(len(vectors))[::-1]
    np.testing.assert_allclose(selector._gp.mean.numpy(), w @ np.stack(vectors) / w.sum())
    assert not FedCorSelector(warmup_rounds=2, **FAST).fit(ClientPool([5] * 24))._gp.mean.any()


def test_late_start_keeps_observing_until_first_fit():
    selector = FedCorSelector(warmup_rounds=2, **FAST, random_state=0)
    oracle = GroupOracle()
    selector.fit(ClientPool(np.full(oracle.n_clients, 50)))
    oracle.round = 30
    selector.select(3, round=30, oracle=oracle)  # first call long after warm-up: only a baseline
    assert selector.fit_log_ == []
    oracle.advance()
    selector.select(3, round=31, oracle=oracle)
    assert [r.round for r in selector.fit_log_] == [31]
    assert [kind for (_, kind, _) in oracle.calls] == ["losses", "losses"]


# -- what it learns ------------------------------------------------------------------------
def test_learns_group_covariance_and_picks_across_groups():
    """Paper defaults (W = 15, 150 Adam steps per warm-up round, lr 0.01) on a 3-group federation."""
    oracle = GroupOracle(sizes=(8, 8, 8), scales=(0.3, 0.2, 0.25), noise=0.05, seed=1)
    selector = FedCorSelector(rank=3, noise=0.05, random_state=0)
    run(selector, oracle, 3, 17)
    similarity = cosine(selector.covariance_, oracle.covariance)
    print(f"cosine similarity of FedCor's covariance and the truth after warm-up: {similarity:.3f}")
    # 11 vectors in the warm-up window: even their empirical covariance is only about this close
    assert similarity > 0.85
    picks = selector.last_selection_order_
    assert sorted(oracle.groups[picks].tolist()) == [0, 1, 2]
    assert selector.embeddings_.shape == (3, 24)
    x = selector.embeddings_
    np.testing.assert_allclose(selector.covariance_, x.T @ x + 0.05**2 * np.eye(24))


def test_reproducible_and_refit_starts_over():
    a = run(FedCorSelector(warmup_rounds=2, gp_interval=3, **FAST, random_state=5), GroupOracle(seed=2), 4, 8)
    selector = FedCorSelector(warmup_rounds=2, gp_interval=3, **FAST, random_state=5)
    b = run(selector, GroupOracle(seed=2), 4, 8)
    c = run(selector, GroupOracle(seed=2), 4, 8)  # fit() again: same run from scratch
    for x, y, z in zip(a, b, c):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(x, z)


def test_closed_form_solver_learns_the_same_gp_and_picks_alike():
    """gp_solver="closed-form" computes the paper's likelihood by hand: the same GP to rounding, the same picks."""
    runs = {}
    for solver in ("gpytorch", "closed-form"):
        oracle = GroupOracle(sizes=(8, 8, 8), scales=(0.3, 0.2, 0.25), noise=0.05, seed=1)
        selector = FedCorSelector(rank=3, noise=0.05, warmup_rounds=4, gp_interval=3, warmup_iters=40, gp_iters=40,
                                  gp_solver=solver, random_state=0)
        runs[solver] = (run(selector, oracle, 3, 10), selector)
    (a, sa), (b, sb) = runs["gpytorch"], runs["closed-form"]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_allclose(sb.embeddings_, sa.embeddings_, rtol=1e-8, atol=1e-10)
    assert [f.kind for f in sb.fit_log_] == [f.kind for f in sa.fit_log_]
    np.testing.assert_allclose([f.nll for f in sb.fit_log_], [f.nll for f in sa.fit_log_], rtol=1e-9)


@pytest.mark.parametrize("solver", ["gpytorch", "closed-form"])
def test_every_fit_uses_the_chosen_solver(monkeypatch, solver):
    selector = FedCorSelector(warmup_rounds=2, gp_interval=3, gp_solver=solver, **FAST, random_state=0)
    spy = spied(selector, monkeypatch)
    run(selector, GroupOracle(), 3, 7)
    assert len(spy.calls) >= 3 and {c["solver"] for c in spy.calls} == {solver}


def test_gp_solver_is_left_out_of_run_identity_at_its_default():
    """A parameter added after runs were recorded does not change what identifies those runs."""
    from fedselect.plugins import as_selector_spec

    assert "gp_solver" not in FedCorSelector(rank=4).identifying_params()
    assert FedCorSelector(gp_solver="closed-form").identifying_params()["gp_solver"] == "closed-form"
    assert "gp_solver" not in as_selector_spec(FedCorSelector(rank=4)).settings()["params"]
    assert set(FedCorSelector().get_params()) - set(FedCorSelector().identifying_params()) == {
        "gp_solver", "warmup_fit_start", "anneal_before_fit_start", "gp_device", "gp_round_offset"}  # test_fedcor_2022


# -- bad input -----------------------------------------------------------------------------
def test_small_federation_clamps_rank_with_warning():
    with pytest.warns(UserWarning, match=r"rank=15 .* N=6"):
        selector = FedCorSelector(warmup_rounds=1, warmup_iters=2, gp_iters=2).fit(ClientPool([5] * 6))
    assert selector.rank_ == 5
    oracle = GroupOracle(sizes=(3, 3), scales=(0.3, 0.2))
    for t in range(4):
        assert len(selector.select(6, round=t, oracle=oracle).clients) == 6  # n = N works too
        oracle.advance()
    assert selector.embeddings_.shape == (5, 6)


class BrokenOracle(GroupOracle):
    def __init__(self, *, bad_round=None, bad_value=np.inf, short=False, trial_short=False):
        super().__init__()
        self.bad_round, self.bad_value = bad_round, bad_value
        self.short, self.trial_short = short, trial_short

    def losses(self, ids):
        out = super().losses(ids)
        if self.round == self.bad_round:
            out[3] = self.bad_value
        return out[:-1] if self.short else out

    def trial(self, ids):
        out = super().trial(ids)
        return out[:-2] if self.trial_short else out


def test_infinite_loss_change_names_the_round():
    oracle = BrokenOracle(bad_round=2)
    with pytest.raises(ValueError, match=r"loss-change vector of round 1 .*infinite.*client\(s\) \[3\]"):
        run(FedCorSelector(warmup_rounds=4, **FAST), oracle, 3, 4)


def test_missing_answer_is_left_out_of_the_vector():
    """A client that did not answer (NaN) is missing from its loss-change vectors, and the run goes on."""
    oracle = BrokenOracle(bad_round=2, bad_value=np.nan)
    sel = FedCorSelector(warmup_rounds=4, **FAST)
    run(sel, oracle, 3, 6)
    by_round = {r.round: r.values for r in sel.history_}
    assert np.isnan(by_round[1][3]) and np.isnan(by_round[2][3])  # l(w^2) - l(w^1) and l(w^3) - l(w^2)
    assert np.isfinite(np.delete(by_round[1], 3)).all() and np.isfinite(by_round[3]).all()
    assert np.isfinite(sel.embeddings_).all()


def test_gp_likelihood_of_a_partial_vector_is_the_observed_marginal():
    """log N(v_o | mu_o, X_o^T X_o + s^2 I): exactly the Gaussian's marginal over the clients that answered."""
    from scipy.stats import multivariate_normal

    from fedselect.selectors import _gp

    gp = _gp.LossChangeGP(7, 3, 0.1, generator=torch.Generator().manual_seed(0))
    rng = np.random.default_rng(0)
    values = rng.normal(size=(3, 7))
    values[1, [2, 5]] = np.nan
    values[2, 0] = np.nan
    gp.set_mean(values, np.ones(3))
    got = gp.log_probs(torch.from_numpy(values)).detach().numpy()
    cov, mean = gp.dense_covariance(), gp.mean.numpy()
    assert np.isnan(values[:, 2]).sum() == 1 and mean[2] == pytest.approx(np.nanmean(values[:, 2]))
    for m in range(3):
        obs = ~np.isnan(values[m])
        want = multivariate_normal(mean[obs], cov[np.ix_(obs, obs)]).logpdf(values[m, obs])
        assert got[m] == pytest.approx(want, rel=1e-9)


def test_short_oracle_answers_name_expected_and_got():
    with pytest.raises(ValueError, match=r"returned 23 losses; expected 24"):
        run(FedCorSelector(**FAST), BrokenOracle(short=True), 3, 2)
    with pytest.raises(ValueError, match=r"vector of 22 loss changes; expected 24"):
        run(FedCorSelector(warmup_rounds=1, gp_interval=2, **FAST), BrokenOracle(trial_short=True), 3, 3)


def test_constant_loss_changes_do_not_crash():
    class Flat(GroupOracle):
        def draw(self):
            return np.full(self.n_clients, -0.1)

    selector = FedCorSelector(warmup_rounds=3, gp_interval=5, rank=3, warmup_iters=20, gp_iters=20)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chosen = run(selector, Flat(), 4, 7)
    assert all(len(c) == 4 for c in chosen)
    assert all(np.isfinite(r.nll) for r in selector.fit_log_)
    assert np.all(np.isfinite(selector.embeddings_))


@pytest.mark.parametrize(
    "param, value",
    [
        ("rank", 0),
        ("gp_interval", 0),
        ("beta", 0.0),
        ("beta", 1.5),
        ("theta", -1),
        ("noise", 0),
        ("gp_lr", 0),
        ("schedule", "2022"),
        ("gp_history", "official"),
        ("warmup_rounds", -1),
        ("update_mean", "yes"),
        ("warmup_iters", 2.5),
        ("gp_solver", "woodbury"),
    ],
)
def test_bad_parameters_name_class_parameter_and_value(param, value):
    with pytest.raises(ValueError, match=rf"FedCorSelector: parameter {param}={value!r}"):
        FedCorSelector(**{param: value}).fit(ClientPool([5] * 20))


def test_estimator_conventions():
    selector = FedCorSelector(rank=4, schedule="readme2023")
    assert clone(selector).get_params() == selector.get_params()
    assert "rank=4" in repr(selector)
    with pytest.raises(NotFittedError):
        selector.select(2, round=0, oracle=GroupOracle())
    assert not hasattr(selector, "embeddings_")
    with pytest.raises(AttributeError):
        _ = selector.covariance_


def test_registered_as_fedcor():
    registered = {}
    register_selectors(lambda cls, name, aliases=(): registered.setdefault(name, cls))
    assert registered == {"fedcor": FedCorSelector}


def test_conformance():
    testing = pytest.importorskip("fedselect.testing")
    testing.check_selector(FedCorSelector(warmup_rounds=3, gp_interval=4, warmup_iters=5, gp_iters=5, rank=3))
