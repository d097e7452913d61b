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
#: command also sets ``warmup_rounds=20, gp_interval=50, beta=0.9, theta=0.97``.
CODE_2022: dict[str, Any] = {
    "theta": 0.8,
    "gp_history": "latest",
    "posterior_noise": True,
    "warmup_fit_start": 10,
    "anneal_before_fit_start": True,
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


class FedCorSelector(BaseSelector):
    """FedCor: choose the clients whose training most lowers the expected global loss under a GP.

    The loss changes of all N clients in one round are modelled as a Gaussian process over
    clients (Tang et al. [1]_, Eq. 8), ``dl ~ N(mu, Sigma)`` with ``Sigma = X^T X + s_n^2 I``:
    a homogeneous linear kernel on learnable client embeddings ``X in R^{d x N}`` (Eq. 14)
    plus a fixed noise ``s_n``. Clients with similar data get correlated loss changes, and
    the selection prefers clients that are correlated with many others but not with each
    other (Lemma 2).

    **Schedule** (Algorithm 2 and appendix C of [1]_), with W = ``warmup_rounds``,
    Dt = ``gp_interval`` and s = ``warmup_fit_start`` (0 by default):

    - Rounds ``0..W`` (warm-up): ``n`` clients uniformly at random without replacement.
      Every client's loss on the global model is observed at the start of rounds
      ``s..W+1`` through ``oracle.losses`` (paid), so the select call of round ``t``
      (``s + 1 <= t <= W+1``) forms ``dl^{t-1} = l(w^t) - l(w^{t-1})`` and fits X with
      ``warmup_iters`` Adam steps on Eq. (17) with Dt = 1 and M = ``warmup_history``: the
      vectors of rounds ``t-1, ..., max(t-1-M, s)``, a vector of age a weighted ``theta^a``.
    - Rounds ``t > W``: Algorithm 1 with ``alpha_k = beta^tau_k`` (Eq. 9), then the chosen
      clients' ``alpha_k`` are multiplied by ``beta`` (Algorithm 2, line 14).
    - GP rounds ``t > W`` with ``t % Dt == 0``: every ``alpha_k`` is reset to 1 (line 9),
      ``oracle.trial`` runs once on ``n`` uniformly random clients (paid: the trial is
      trained and evaluated on every client but not applied; S = 1), its vector joins the
      history, and X is refitted with ``gp_iters`` steps on Eq. (17) with M = ``history``:
      the vectors of rounds ``t, t - Dt, ..., t - M Dt`` weighted ``theta^(m Dt)``
      (``gamma = theta^Dt``, appendix C; ``gp_history="latest"``: the M + 1 most recent
      vectors instead). The round then still trains an Algorithm-1 selection.

    If ``select`` is first called after round W (or rounds were skipped so that no vector
    could be formed), the selector keeps observing losses and choosing uniformly until its
    first fit: Algorithm 1 never runs on an untrained GP.

    **Readings.** The defaults are the paper's text (Algorithm 1 with Eq. 11, M = 10 warm-up
    vectors from round 0, theta of appendix C), which the official code after its February
    2023 refactor also selects by. The code behind the paper's Table 1 (July 2022, commit
    8ce23fb) differs in five settings, each a parameter: ``theta=0.8`` (its FMNIST command
    leaves ``--GPR_gamma`` at 0.8), ``gp_history="latest"``, ``posterior_noise=True``,
    ``warmup_fit_start=10`` (its ``gpr_begin``) and ``anneal_before_fit_start=True``; the
    dictionary :data:`CODE_2022` holds them. Its GP rounds fall one round later than ours
    (``t % Dt == 1`` in this numbering). ``schedule="readme2023"`` follows the 2023 README:
    one 1000-iteration fit when the last warm-up vector arrives, every fit on the vectors of
    the last 100 rounds weighted 0.95 per round (replacing ``warmup_iters``,
    ``warmup_history``, ``history``, ``gp_history`` and ``theta``); with
    ``update_mean=True, beta=0.95`` it is the README's FMNIST command. Every selection
    after the warm-up is annealed under every setting. The docs page sets out each reading
    against the official code and what was run with it.

    **Aggregation.** FedCor averages the chosen clients' models with equal weights (Eq. 4),
    so no weights are returned and the trainer aggregates by its own rule; the FedCor
    presets set the trainer's ``aggregation="mean"``. :meth:`update` learns nothing: every
    loss the GP needs comes through the oracle.

    **Clients that do not answer** (NaN answers of the oracle, see
    :class:`~fedselect.ClientOracle`): a loss-change vector keeps NaN where a client did not
    answer in either of its two rounds, and the GP's likelihood of that vector is the
    exact marginal over the clients that did (``X_o^T X_o + s_n^2 I`` on the observed
    clients), so a missing answer neither biases X nor stops the schedule; a vector with
    fewer than two answers is dropped, and a fit whose window holds no vector keeps the
    current X. Not in the paper, which assumes every client answers.

    **Costs.** Warm-up: N losses per round for ``W + 2 - s`` rounds. Each GP round: one trial
    (``n`` local trainings, N models down, N losses up). Nothing else.

    **Scale.** The paper's GP is over all N clients, but its kernel ``X^T X + s_n^2 I`` is
    low rank plus diagonal, so nothing needs the N x N covariance (80 GB in float64 at
    N = 100,000). The GP is a GPyTorch ``MultivariateNormal`` over a
    ``LowRankRootAddedDiagLinearOperator``: an Adam step on M vectors costs
    O(N d^2 + N d M) time (Woodbury identity and matrix determinant lemma on a d x d
    Cholesky factor) and O(N (d + M)) memory, and selection is O(N (d + n)) per pick
    (Sigma minus accumulated rank-one terms); this is the paper's model computed exactly,
    not an approximation. The state is X (N x d; during a fit also its gradient and Adam's two
    moments), the annealing factors and the last losses (N each) and at most
    ``max(warmup_history, history * gp_interval) + 1`` loss-change vectors (N each): about
    ``8 N (4 d + 13)`` bytes at the defaults, 58 MB at N = 100,000, so no N breaks it before
    the federation itself does. Time is what grows: over a 500-round FMNIST schedule (W = 15, Dt = 10) the
    warm-up fits take 16 x 150 Adam steps and the 48 GP rounds 100 steps each, plus the
    warm-up's N losses per round and each GP round's trial evaluated on all N clients;
    ``gp_solver="closed-form"`` computes the same likelihood and its gradient in O(N d^2)
    without GPyTorch's autograd graph (see the parameter). Measured seconds per round at
    N = 1,000 to 100,000: ``benchmarks/bench_scale.py`` (and ``benchmarks/bench_fedcor_gp.py``
    for the fit alone); the results are on the reproductions page.

    Parameters
    ----------
    rank : int, default=15
        d, the embedding dimension (appendix C: d = 15). **choice**: a federation with
        ``N <= rank`` clients uses ``rank_ = max(N - 1, 1)`` with a ``UserWarning`` (the paper
        requires d < N; a larger d only adds redundant parameters).
    warmup_rounds : int, default=15
        W, the last warm-up round (15 for FMNIST, 20 for CIFAR-10; Sec. 5.1).
    gp_interval : int, default=10
        Dt, rounds between GP rounds (Eq. 16; 10 for FMNIST, 50 for CIFAR-10).
    beta : float, default=0.95
        The annealing coefficient of Eq. (9) in (0, 1] (0.95 FMNIST, 0.9 CIFAR-10; 1 disables annealing).
    theta : float, default=0.9
        The per-round discount of old vectors, ``gamma = theta^Dt`` in Eq. (17) (appendix C:
        0.9 FMNIST, 0.99 CIFAR-10; the 2022 code ran 0.8 and 0.97).
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
        Fit with ``mu_k`` = the discounted mean of client k's loss changes in the fit's
        vectors (the 2023 code) instead of ``mu = 0`` (the paper, footnote 1). It changes
        the likelihood and so X; the selection itself does not depend on mu.
    schedule : {"paper", "readme2023"}, default="paper"
        Which GP-fitting schedule to follow (see Readings).
    gp_history : {"rounds", "latest"}, default="rounds"
        Which older vectors a GP round's fit uses: those of rounds ``t - m Dt`` (Eq. 17 read
        literally) or the M most recent ones before the trial, weighted ``gamma^m`` by
        position (the 2022 code; at the first GP round the older vector is then the last
        warm-up vector). Ignored by ``schedule="readme2023"``.
    posterior_noise : bool, default=False
        Condition Algorithm 1 on *noisy* predictions, as the 2022 code does: start from
        ``X^T X`` and divide by ``S_kk + s_n^2`` (see
        :func:`fedselect.selectors._gp.greedy_select`). The default follows Eq. (11).
    warmup_fit_start : int, default=0
        s, the first round whose loss change the warm-up observes and fits (at most W): no
        loss is asked for before round s, the first fit is at round s + 1 and no warm-up fit
        sees a vector older than round s. The 2022 code's ``gpr_begin`` is 10: on the FMNIST
        schedule its warm-up fits use at most 6 vectors (rounds 10-15) where the default's use
        up to 11.
    anneal_before_fit_start : bool, default=False
        Multiply by ``beta`` the factors ``alpha_k`` of the clients chosen uniformly in rounds
        ``0..s-1``, as the 2022 code's annealing branch does there; they then weigh the
        Algorithm-1 selections until the first GP round's reset (rounds W + 1 to the first
        multiple of Dt). Does nothing when s = 0.
    gp_solver : {"gpytorch", "closed-form"}, default="gpytorch"
        How each Adam step evaluates the objective of Eq. (17): through the GPyTorch model
        (the default; every recorded result used it), or by the same Woodbury and
        determinant-lemma formulas written out in torch with the per-fit constants
        (``r^T r``, the residuals) computed once per fit
        (:meth:`fedselect.selectors._gp.LossChangeGP.closed_form_objective`). Both give the
        paper's exact likelihood and gradient (they agree to about 1e-14 relative); the
        closed form skips linear_operator's generic machinery (the time it saves is measured
        by ``benchmarks/bench_scale.py``). Float rounding differs, so a run
        with it is not bit-for-bit the default's (the GP and, rarely, a selection may differ).
    random_state : None, int or numpy RandomState, default=None
        Seeds the warm-up and trial choices and, through a torch Generator, the initial
        embeddings drawn from N(0, 1/d).

    Attributes
    ----------
    rng_ : numpy RandomState
        The selection stream.
    rank_ : int
        The embedding dimension in use (``rank``, or less for a small federation).
    embeddings_ : ndarray, shape (``rank_``, n_clients)
        X, a copy of the current embeddings.
    covariance_ : ndarray, shape (n_clients, n_clients)
        ``X^T X + s_n^2 I``, computed on each access (for diagnostics at small N).
    alpha_ : ndarray, shape (n_clients,)
        The annealing factors ``beta^tau_k`` in use.
    history_ : list of LossChangeRecord
        The loss-change vectors a future fit may still use, oldest first.
    fit_log_ : list of FitRecord
        One record per fit.
    last_selection_order_ : ndarray of int
        The clients of the last Algorithm-1 selection in the order they were picked.
    n_clients_ : int
        N.

    References
    ----------
    .. [1] Tang, M., Ning, X., Wang, Y., Sun, J., Wang, Y., Li, H., Chen, Y. "FedCor:
       Correlation-Based Active Client Selection Strategy for Heterogeneous Federated
       Learning." CVPR 2022 (Eq. 17; appendix C for d, M, theta, W and Dt).
    .. [2] The official code, https://github.com/Yoruko-Tang/FedCor: ``src/federated_main.py``
       and ``src/GPR.py`` as of July 2022 (the code behind the paper, :data:`CODE_2022`) and
       after the February 2023 refactor (``schedule="readme2023"``).

    Examples
    --------
    >>> from fedselect.selection import ClientPool
    >>> from fedselect.testing import SyntheticOracle
    >>> oracle = SyntheticOracle(20, random_state=0)
    >>> sel = FedCorSelector(warmup_rounds=2, warmup_iters=20, gp_iters=20, rank=3, random_state=0)
    >>> sel = sel.fit(ClientPool([10] * 20))
    >>> for t in range(5):
    ...     chosen = sel.select(4, round=t, oracle=oracle)
    ...     _ = oracle.run_round(chosen)
    >>> sel.embeddings_.shape
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
        gp_solver: str = "gpytorch",
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
        self.gp_solver = gp_solver
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
        "gp_solver": [StrOptions(_gp.SOLVERS)],
        "random_state": ["random_state"],
    }
    _params_added_later: ClassVar[dict[str, Any]] = {"gp_solver": "gpytorch", "warmup_fit_start": 0,
                                                     "anneal_before_fit_start": False}

    def _validate_params(self) -> None:
        super()._validate_params()
        check_param(self, "warmup_fit_start", self.warmup_fit_start, self.warmup_fit_start <= self.warmup_rounds,
                    f"an int in [0, warmup_rounds={self.warmup_rounds}] (a round of the warm-up)")

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
        self._gp = _gp.LossChangeGP(n_clients, self.rank_, float(self.noise), generator=generator)
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

        gp_round = t % self.gp_interval == 0
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

        Adam with a fitting step decreases the weighted negative log-likelihood of Eq. (17); an
        increase of more than 5 % of its magnitude (and 1 nat) means the steps overshoot, i.e.
        gp_lr is too large for these loss changes, and the selections that follow use a bad GP.
        """
        if not np.isfinite(result.nll) or not np.isfinite(self._gp.root.detach().numpy()).all():
            raise FloatingPointError(
                f"FedCorSelector: the GP fit of round {t} ({kind}) diverged (negative log-likelihood "
                f"{result.nll}); try a gp_lr below the current {self.gp_lr!r} (the paper's value is 0.01) or check "
                "the clients' losses"
            )
        start = result.initial_nll
        if np.isfinite(start) and result.nll > start + max(1.0, 0.05 * abs(start)):
            warnings.warn(
                f"FedCorSelector: the GP fit of round {t} ({kind}) ended with a worse negative log-likelihood "
                f"({result.nll:.4g}) than it started with ({start:.4g}): Adam overshoots on these loss changes; try "
                f"a gp_lr below the current {self.gp_lr!r} (the paper's value is 0.01)",
                RuntimeWarning,
                stacklevel=4,
            )


@hookimpl
def register_selectors(register: Any) -> None:
    """Register :class:`FedCorSelector` as ``"fedcor"``."""
    register(FedCorSelector, name="fedcor")
