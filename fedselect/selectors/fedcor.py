"""FedCor: correlation-based active client selection with a Gaussian process (Tang et al., CVPR 2022)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
import torch
from sklearn.utils import check_random_state

from .._validation import Interval, StrOptions
from ..devices import DEVICE_CONSTRAINTS, device_setting, resolve_device
from ..hookspecs import hookimpl
from ..selection import BaseSelector, ClientOracle, ClientPool, Selection, check_param
from . import _gp

__all__ = ["CODE_2022", "FedCorSelector", "FitRecord", "LossChangeRecord"]

SCHEDULES = ("paper", "readme2023")
GP_HISTORIES = ("rounds", "latest")
# The February 2023 README (FMNIST command: --group_size=100 --GPR_gamma=0.95, and the
# 1000-iteration fit at the end of warm-up that the code runs with --update_mean).
README2023_WARMUP_ITERS = 1000
README2023_WINDOW = 100
README2023_DISCOUNT = 0.95
#: The official code of July 2022 (commit 8ce23fb, the code behind the paper's Table 1) run with its README's
#: FMNIST command, in the parameters that differ from the defaults: ``FedCorSelector(**CODE_2022)``. Its CIFAR-10
#: command also sets ``warmup_rounds=20, gp_interval=50, beta=0.9, theta=0.97``. ``gp_round_offset=1``: its GP step
#: runs at the end of round e (``e > W``, ``e % Dt == 0``, federated_main.py) on w^{e+1} and serves round e + 1.
CODE_2022: dict[str, Any] = {
    "theta": 0.8,
    "gp_history": "latest",
    "posterior_noise": True,
    "warmup_fit_start": 10,
    "anneal_before_fit_start": True,
    "gp_round_offset": 1,
}


@dataclass(frozen=True, eq=False)
class LossChangeRecord:
    """One observed loss-change vector ``dl^t = l(w^{t+1}) - l(w^t)`` of all N clients.

    Attributes
    ----------
    round : int
        t: for a warm-up vector the round whose training produced it; for a trial, the
        GP round t whose model w^t the trial started from.
    source : str
        ``"warmup"`` (observed around a real round) or ``"trial"`` (``oracle.trial``).
    values : ndarray of float, shape (n_clients,)
        The loss changes (read-only).
    """

    round: int
    source: str
    values: np.ndarray


@dataclass(frozen=True)
class FitRecord:
    """One fit of the GP: when, on how many vectors, how long, and how well.

    Attributes
    ----------
    round : int
        The round whose ``select`` ran the fit.
    kind : str
        ``"warmup"`` or ``"gp_round"``.
    iterations : int
        Adam steps.
    n_vectors : int
        Loss-change vectors in the objective.
    nll : float
        The final weighted negative log-likelihood ``-Phi_t(X)`` (Eq. 17) after the last step.
    seconds : float
        Wall-clock time of the fit.
    """

    round: int
    kind: str
    iterations: int
    n_vectors: int
    nll: float
    seconds: float


def _gp_device(device: str | torch.device) -> torch.device:
    """The device ``gp_device`` names here: as :func:`~fedselect.simulation.engine.resolve_device`, but ``"auto"`` is
    CUDA if torch sees a GPU, else the CPU, never MPS (no float64 there)."""
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    return resolve_device(device)


class FedCorSelector(BaseSelector):
    """FedCor: choose the clients whose training most lowers the expected global loss under a GP.

    The loss changes of all N clients in one round, ``dl^t = l(w^{t+1}) - l(w^t)``, are a Gaussian process over clients
    (Tang et al. [1]_, Eqs. 8 and 14): ``dl ~ N(mu, Sigma)``, ``Sigma = X^T X + s_n^2 I``, with learnable client
    embeddings ``X in R^{d x N}`` and a fixed noise s_n. Selection (Algorithm 1, Eqs. 9 and 11) starts from ``S =
    Sigma`` and picks n clients greedily, ``k* = argmax_k alpha_k sum_i p_i S_ik / sqrt(S_kk)``, then ``S <- S -
    S_{:,k*} S_{k*,:} / S_{k*k*}``, with the annealing factor ``alpha_k = beta^tau_k`` (tau_k: times k was chosen).
    Fitting (Eq. 17) runs Adam on ``Phi_t(X) = sum_{m=0..M} gamma^m log p(dl^{t - m Dt} | X)``, ``gamma = theta^Dt``.
    Schedule (Algorithm 2), W = ``warmup_rounds``, Dt = ``gp_interval``: rounds 0..W choose uniformly, observe every
    client's loss and refit X after each new vector; later rounds run Algorithm 1, and each round ``t - o > W`` with
    ``(t - o) % Dt == 0`` (o = ``gp_round_offset``) resets alpha, runs one trial on n random clients and refits X.
    Models are averaged uniformly (Eq. 4). Readings (:data:`CODE_2022`): :ref:`selector_fedcor`.

    **Costs.** Warm-up: N losses a round (N down, N scalars up) for ``W + 2 - warmup_fit_start`` rounds; GP round: a
    trial (n trainings, N down, N losses up). Server: Adam O(N d^2 + N d M), pick O(N (d + n)), 8N(4d + 13) B.

    Parameters
    ----------
    rank : int, default=15
        d, the embedding dimension (appendix C); ``max(N - 1, 1)`` with a warning when ``N <= rank`` (d < N).
    warmup_rounds : int, default=15
        W, the last warm-up round (15 for FMNIST, 20 for CIFAR-10; Sec. 5.1).
    gp_interval : int, default=10
        Dt, rounds between GP rounds (Eq. 16; 10 for FMNIST, 50 for CIFAR-10).
    beta : float, default=0.95
        The annealing coefficient of Eq. (9) in (0, 1] (0.95 FMNIST, 0.9 CIFAR-10; 1 disables annealing).
    theta : float, default=0.9
        Per-round discount, ``gamma = theta^Dt`` in Eq. (17) (0.9 FMNIST, 0.99 CIFAR-10; the 2022 code 0.8, 0.97).
    warmup_history : int, default=10
        M of Eq. (17) in the warm-up phase (appendix C: M = 10, i.e. 11 vectors).
    history : int, default=1
        M of Eq. (17) at GP rounds (appendix C: M = 1).
    gp_lr : float, default=0.01
        Adam's learning rate for X (appendix C).
    warmup_iters : int, default=150
        Adam steps after each warm-up vector (the official 2022 code).
    gp_iters : int, default=100
        Adam steps at each GP round (the official code's ``GPR_Epoch``).
    noise : float, default=0.01
        s_n, the fixed noise standard deviation of the kernel (the official code).
    update_mean : bool, default=False
        Fit with ``mu_k`` the discounted mean of k's loss changes (the 2023 code), not ``mu = 0`` (footnote 1).
    schedule : {"paper", "readme2023"}, default="paper"
        The GP-fitting schedule: the paper's, or the official code's 2023 README (see :ref:`fedcor-readings`).
    gp_history : {"rounds", "latest"}, default="rounds"
        A GP round's older vectors: rounds ``t - m Dt`` (Eq. 17) or the M most recent (the 2022 code).
    posterior_noise : bool, default=False
        Algorithm 1 on noisy predictions (from ``X^T X``, over ``S_kk + s_n^2``: the 2022 code), not Eq. (11).
    warmup_fit_start, anneal_before_fit_start : int, bool, default=0, False
        s <= W, the first warm-up round observed and fitted (the 2022 code's ``gpr_begin``, 10); whether to anneal
        the clients chosen uniformly in rounds ``0..s-1``, as the 2022 code does (nothing when s = 0).
    gp_round_offset : int, default=0
        o < Dt, the GP rounds' shift: 0 the paper's rounds, 1 the 2022 code's (each one round later).
    gp_solver : {"gpytorch", "closed-form"}, default="gpytorch"
        Eq. (17) through GPyTorch (every recorded result) or written out in torch (faster at large N, not bit-equal).
    gp_device : str or torch.device, default="cpu"
        The GP's device (float64): ``"cpu"`` (every recorded run), ``"cuda[:N]"``, ``"auto"`` (CUDA, else CPU).
    random_state : None, int or numpy RandomState, default=None
        Seeds the warm-up and trial choices and, through a torch Generator, the initial embeddings (N(0, 1/d)).

    Attributes
    ----------
    rng_, rank_, n_clients_, alpha_ : numpy RandomState, int, int, ndarray
        The selection stream; the embedding dimension (``rank``, less for a small N); N; ``beta^tau_k`` in use.
    embeddings_, covariance_ : ndarray, shapes (``rank_``, N) and (N, N)
        X (a copy) and ``X^T X + s_n^2 I`` (computed on each access, for diagnostics at small N).
    last_selection_order_, history_, fit_log_ : ndarray, list of LossChangeRecord, list of FitRecord
        The last Algorithm-1 picks in order; the loss-change vectors a future fit may use (oldest first); the fits.

    References
    ----------
    .. [1] Tang, M., et al. "FedCor: Correlation-Based Active Client Selection Strategy for Heterogeneous Federated
       Learning." CVPR 2022 (appendix C: d, M, theta, W and Dt).
    .. [2] The official code, https://github.com/Yoruko-Tang/FedCor: July 2022 (:data:`CODE_2022`) and February 2023.

    Examples
    --------
    >>> FedCorSelector(rank=3, random_state=0).fit(ClientPool([10] * 20)).embeddings_.shape
    (3, 20)
    """

    #: learned state that comparisons save with each run (for the t-SNE of Fig. 7)
    diagnostics: ClassVar[tuple[str, ...]] = ("embeddings_",)

    def __init__(
        self,
        *,
        rank: int = 15,
        warmup_rounds: int = 15,
        gp_interval: int = 10,
        beta: float = 0.95,
        theta: float = 0.9,
        warmup_history: int = 10,
        history: int = 1,
        gp_lr: float = 0.01,
        warmup_iters: int = 150,
        gp_iters: int = 100,
        noise: float = 0.01,
        update_mean: bool = False,
        schedule: str = "paper",
        gp_history: str = "rounds",
        posterior_noise: bool = False,
        warmup_fit_start: int = 0,
        anneal_before_fit_start: bool = False,
        gp_round_offset: int = 0,
        gp_solver: str = "gpytorch",
        gp_device: str | torch.device = "cpu",
        random_state: Any = None,
    ) -> None:
        self.rank = rank
        self.warmup_rounds = warmup_rounds
        self.gp_interval = gp_interval
        self.beta = beta
        self.theta = theta
        self.warmup_history = warmup_history
        self.history = history
        self.gp_lr = gp_lr
        self.warmup_iters = warmup_iters
        self.gp_iters = gp_iters
        self.noise = noise
        self.update_mean = update_mean
        self.schedule = schedule
        self.gp_history = gp_history
        self.posterior_noise = posterior_noise
        self.warmup_fit_start = warmup_fit_start
        self.anneal_before_fit_start = anneal_before_fit_start
        self.gp_round_offset = gp_round_offset
        self.gp_solver = gp_solver
        self.gp_device = gp_device
        self.random_state = random_state

    # -- parameters -------------------------------------------------------------------
    # gp_lr is Adam's step: each step moves every embedding coordinate by up to about gp_lr, while the
    # coordinates start at scale 1/sqrt(rank); above 1 the fit diverges (see _gp.LossChangeGP.fit).
    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "rank": [Interval(Integral, 1, None, closed="left")],
        "warmup_rounds": [Interval(Integral, 0, None, closed="left")],
        "gp_interval": [Interval(Integral, 1, None, closed="left")],
        "beta": [Interval(Real, 0, 1, closed="right")],
        "theta": [Interval(Real, 0, 1, closed="right")],
        "warmup_history": [Interval(Integral, 0, None, closed="left")],
        "history": [Interval(Integral, 0, None, closed="left")],
        "gp_lr": [Interval(Real, 0, 1, closed="right")],
        "warmup_iters": [Interval(Integral, 0, None, closed="left")],
        "gp_iters": [Interval(Integral, 0, None, closed="left")],
        "noise": [Interval(Real, 0, None, closed="neither")],
        "update_mean": ["boolean"],
        "schedule": [StrOptions(SCHEDULES)],
        "gp_history": [StrOptions(GP_HISTORIES)],
        "posterior_noise": ["boolean"],
        "warmup_fit_start": [Interval(Integral, 0, None, closed="left")],
        "anneal_before_fit_start": ["boolean"],
        "gp_round_offset": [Interval(Integral, 0, None, closed="left")],
        "gp_solver": [StrOptions(_gp.SOLVERS)],
        "gp_device": DEVICE_CONSTRAINTS,
        "random_state": ["random_state"],
    }

    def identifying_params(self) -> dict[str, Any]:
        """As :meth:`BaseSelector.identifying_params`, with ``gp_device`` as a run's settings record a device
        (:func:`~fedselect.simulation.engine.device_setting`): every form of the CPU is the default, left out, and
        ``"auto"`` is the kind it chose."""
        params = super().identifying_params()
        if "gp_device" in params:
            try:
                value = params["gp_device"]
                auto = isinstance(value, str) and value == "auto"
                setting = _gp_device(value).type if auto else device_setting(value)
            except (TypeError, ValueError):  # a device this machine lacks: keep the name as given
                setting = str(params["gp_device"])
            if setting == "cpu":
                del params["gp_device"]
            else:
                params["gp_device"] = setting
        return params

    def _validate_params(self) -> None:
        super()._validate_params()
        check_param(self, "warmup_fit_start", self.warmup_fit_start, self.warmup_fit_start <= self.warmup_rounds,
                    f"an int in [0, warmup_rounds={self.warmup_rounds}] (a round of the warm-up)")
        check_param(self, "gp_round_offset", self.gp_round_offset, self.gp_round_offset < self.gp_interval,
                    f"an int in [0, gp_interval={self.gp_interval}) (rounds after a multiple of gp_interval)")
        check_param(self, "gp_device", self.gp_device, _gp_device(self.gp_device).type != "mps",
                    "'cpu', 'cuda', 'cuda:N' or 'auto' (the GP computes in float64, which MPS lacks)")

    def _fit(self, pool: ClientPool) -> None:
        n_clients = pool.n_clients
        self.rng_ = check_random_state(self.random_state)
        self.rank_ = int(self.rank)
        if self.rank_ >= n_clients:
            self.rank_ = max(n_clients - 1, 1)
            warnings.warn(
                f"FedCorSelector: rank={self.rank} is not below the number of clients N={n_clients}; "
                f"using rank {self.rank_} (the GP's embeddings need d < N)",
                UserWarning,
                stacklevel=3,
            )
        generator = torch.Generator().manual_seed(int(self.rng_.randint(0, 2**31 - 1)))
        self._gp = _gp.LossChangeGP(
            n_clients, self.rank_, float(self.noise), generator=generator, device=_gp_device(self.gp_device)
        )
        self.alpha_ = np.ones(n_clients)
        self.history_: list[LossChangeRecord] = []
        self.fit_log_: list[FitRecord] = []
        self.last_selection_order_ = np.empty(0, dtype=np.int64)
        self._last_losses: tuple[int, np.ndarray] | None = None

    @property
    def embeddings_(self) -> np.ndarray:
        """X, shape (``rank_``, n_clients): a copy of the current client embeddings."""
        return self._fitted_gp().embeddings

    @property
    def covariance_(self) -> np.ndarray:
        """``X^T X + s_n^2 I``, dense, shape (n_clients, n_clients), computed on demand (small N only)."""
        return self._fitted_gp().dense_covariance()

    def _fitted_gp(self) -> _gp.LossChangeGP:
        gp = self.__dict__.get("_gp")
        if gp is None:
            raise AttributeError(f"{type(self).__name__} is not fitted yet; call fit(pool) first")
        return gp

    # -- selection --------------------------------------------------------------------
    def _select(self, n: int, *, round: int, oracle: ClientOracle) -> Selection:
        t = round
        n_clients = self.n_clients_
        readme = self.schedule == "readme2023"
        fitted = bool(self.fit_log_)
        start = int(self.warmup_fit_start)
        if t >= start and (t <= self.warmup_rounds + 1 or not fitted):
            losses = self._observe_losses(oracle, t)
            previous, self._last_losses = self._last_losses, (t, losses)
            if previous is not None and previous[0] == t - 1:
                self._add_vector(t - 1, "warmup", losses - previous[1])
                last_warmup = t - 1 >= self.warmup_rounds
                if not readme:
                    self._fit_gp(t, t - 1, 1, self.warmup_history, self.warmup_iters, "warmup")
                elif last_warmup:
                    self._fit_gp(t, t - 1, 1, README2023_WINDOW, README2023_WARMUP_ITERS, "warmup")
            fitted = bool(self.fit_log_)
        if t <= self.warmup_rounds or not fitted:
            chosen = np.sort(self.rng_.choice(n_clients, n, replace=False))
            if t < start and self.anneal_before_fit_start:
                # the 2022 code's annealing branch also runs for the warm-up rounds before gpr_begin
                self.alpha_[chosen] *= self.beta
            return Selection(chosen)

        shifted = t - int(self.gp_round_offset)  # o = 0: t > W here already, so the paper's rounds are unchanged
        gp_round = shifted > self.warmup_rounds and shifted % self.gp_interval == 0
        if gp_round:
            self.alpha_[:] = 1.0
            trial_ids = np.sort(self.rng_.choice(n_clients, n, replace=False))
            self._add_vector(t, "trial", self._observe_trial(oracle, t, trial_ids))
            if readme:
                self._fit_gp(t, t, 1, README2023_WINDOW, self.gp_iters, "gp_round")
            else:
                self._fit_gp(
                    t, t, self.gp_interval, self.history, self.gp_iters, "gp_round",
                    latest=self.gp_history == "latest",
                )
        order = _gp.greedy_select(
            self._gp.embeddings,
            float(self.noise),
            self.weights_,
            self.alpha_,
            n,
            posterior_noise=bool(self.posterior_noise),
        )
        self.last_selection_order_ = order
        # Both official codes anneal every Algorithm-1 selection (Update_Discount / update_discount) except the one
        # made just before a reset, whose factors the reset wipes anyway; here the reset precedes the GP round's
        # selection, so every Algorithm-1 selection is annealed under either schedule.
        self.alpha_[order] *= self.beta
        return Selection(np.sort(order))

    # -- observations -----------------------------------------------------------------
    def _observe_losses(self, oracle: ClientOracle, t: int) -> np.ndarray:
        ids = np.arange(self.n_clients_)
        losses = np.asarray(oracle.losses(ids), dtype=np.float64).reshape(-1)
        if losses.shape[0] != ids.shape[0]:
            raise ValueError(
                f"FedCorSelector: oracle.losses(all {ids.shape[0]} clients) in round {t} returned "
                f"{losses.shape[0]} losses; expected {ids.shape[0]} (one per client)"
            )
        return losses

    def _observe_trial(self, oracle: ClientOracle, t: int, ids: np.ndarray) -> np.ndarray:
        values = np.asarray(oracle.trial(ids), dtype=np.float64).reshape(-1)
        if values.shape[0] != self.n_clients_:
            raise ValueError(
                f"FedCorSelector: oracle.trial({ids.shape[0]} clients) in round {t} returned a vector of "
                f"{values.shape[0]} loss changes; expected {self.n_clients_} (one per client)"
            )
        return values

    def _add_vector(self, t: int, source: str, values: np.ndarray) -> None:
        bad = np.flatnonzero(np.isinf(values))
        if bad.size:
            what = "trial" if source == "trial" else "warm-up"
            raise ValueError(
                f"FedCorSelector: the {what} loss-change vector of round {t} has {bad.size} infinite "
                f"value(s), first at client(s) {bad[:5].tolist()}; the clients' losses must be finite"
            )
        if np.count_nonzero(~np.isnan(values)) < 2:
            return  # (almost) nobody answered: the vector says nothing about correlations
        values = values.copy()
        values.setflags(write=False)
        self.history_.append(LossChangeRecord(int(t), source, values))
        if self.schedule == "readme2023":
            keep = README2023_WINDOW
        else:
            keep = max(self.warmup_history, self.history * self.gp_interval)
        self.history_ = [r for r in self.history_ if r.round >= t - keep]

    def _fit_gp(
        self, t: int, newest: int, step: int, depth: int, iterations: int, kind: str, *, latest: bool = False
    ) -> None:
        """Refit X on the vectors of rounds ``newest - m * step`` (m = 0..depth), Eq. (17).

        ``step == 1`` and ``depth == window`` takes every vector of the window (warm-up and
        the 2023 schedule). A vector of age a is weighted ``theta^a``. ``latest``: the
        ``depth + 1`` most recent vectors instead, the m-th newest weighted ``theta^(m * step)``
        (the official 2022 code's GP rounds).
        """
        discount = README2023_DISCOUNT if self.schedule == "readme2023" else float(self.theta)
        if latest:
            records = [r for r in self.history_ if r.round <= newest][-(depth + 1):]
            ages = [(len(records) - 1 - i) * step for i in range(len(records))]
        else:
            wanted = {newest - m * step for m in range(depth + 1)}
            records = [r for r in self.history_ if r.round in wanted]
            ages = [newest - r.round for r in records]
        if not records:  # every vector of the window was empty (clients did not answer): keep X
            return
        values = np.stack([r.values for r in records])
        weights = discount ** np.array(ages, dtype=np.float64)
        if self.update_mean:
            self._gp.set_mean(values, weights)
        try:
            result = self._gp.fit(values, weights, iterations=iterations, lr=float(self.gp_lr),
                                  solver=self.gp_solver)
        except RuntimeError as exc:  # linear_operator's NanError / NotPSDError once the embeddings blow up
            raise FloatingPointError(
                f"FedCorSelector: the GP fit of round {t} ({kind}) diverged ({type(exc).__name__}: {exc}); try "
                f"a gp_lr below the current {self.gp_lr!r} (the paper's value is 0.01) or check the clients' losses"
            ) from exc
        self.fit_log_.append(FitRecord(int(t), kind, result.iterations, len(records), result.nll, result.seconds))
        self._check_gp_fit(t, kind, result)

    def _check_gp_fit(self, t: int, kind: str, result: _gp.FitResult) -> None:
        """A fit whose objective is not finite is an error; one that ends worse than it began, a warning.

        Worse: the weighted negative log-likelihood of Eq. (17) ends more than 5 % of its magnitude
        (and 1 nat) above where the fit started. Each fit restarts Adam (as the official code does);
        its first step moves every coordinate of X by about ``gp_lr``, which throws an X that
        already fits well out of the likelihood's narrow optimum, and the fit's steps may not bring
        it back. The run keeps the X the fit ended with, as FedCor does. With the paper's gp_lr this
        happens on a few fits of a run, more often with a larger one. The docs page's "GP fits that
        end worse than they started" has the measurements.
        """
        if not np.isfinite(result.nll) or not np.isfinite(self._gp.root.detach().cpu().numpy()).all():
            raise FloatingPointError(
                f"FedCorSelector: the GP fit of round {t} ({kind}) diverged (negative log-likelihood "
                f"{result.nll}); try a gp_lr below the current {self.gp_lr!r} (the paper's value is 0.01) or check "
                "the clients' losses"
            )
        start = result.initial_nll
        if np.isfinite(start) and result.nll > start + max(1.0, 0.05 * abs(start)):
            warnings.warn(
                f"FedCorSelector: the GP fit of round {t} ({kind}) ended with a worse negative log-likelihood "
                f"({result.nll:.4g}) than it started with ({start:.4g}). Each fit restarts Adam, as the official "
                "code does, and its first steps move every embedding coordinate by about gp_lr, which can throw "
                "embeddings that already fit well out of the likelihood's narrow optimum; these "
                f"{result.iterations} steps did not bring them back. The run goes on from these embeddings, as "
                "FedCor does, and is still a FedCor run: at the paper's gp_lr of 0.01 this happens on a few fits "
                "(3 of the 160 fits of the README's comparison over 8 seeds). The larger gp_lr, the more often; a "
                f"gp_lr below the current {self.gp_lr!r} makes it rarer but departs from the paper. See 'GP fits "
                "that end worse than they started' on FedCor's documentation page.",
                RuntimeWarning,
                stacklevel=4,
            )


@hookimpl
def register_selectors(register: Any) -> None:
    """Register :class:`FedCorSelector` as ``"fedcor"``."""
    register(FedCorSelector, name="fedcor")
