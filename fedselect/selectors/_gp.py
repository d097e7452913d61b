"""FedCor's Gaussian process over clients' loss changes (private: users see estimator parameters only).

Model (Tang et al., CVPR 2022, Eqs. 8 and 14): the loss changes of all N clients in one
round, ``dl = l(w^{t+1}) - l(w^t)``, follow ``N(mu, Sigma)`` with

    Sigma = X^T X + s_n^2 I,    X in R^{d x N} (one embedding per client, a homogeneous linear kernel).

The model is a :class:`gpytorch.Module` whose forward returns a
:class:`gpytorch.distributions.MultivariateNormal` over a
:class:`~linear_operator.operators.LowRankRootAddedDiagLinearOperator`. That operator
solves with the Woodbury identity and takes log-determinants with the matrix
determinant lemma through a d x d Cholesky factor, so one Adam step on the discounted
log-likelihood of Eq. (17) costs O(N d^2 + N d M) for M vectors and never forms an N x N
matrix. The embeddings are stored as the N x d root ``X^T`` (contiguous rows, so the
operator's matmuls need no transposed copies).

Greedy selection (Algorithm 1, Lemma 2) keeps the working covariance as ``Sigma`` minus
the accumulated rank-one conditioning terms and is O(N (d + C)) per pick.

Memory is O(N (d + M)) throughout: the N x d root, the M loss-change vectors of a fit and
the C rank-one terms of a selection; the N x N covariance (8 N^2 bytes: 80 GB at N = 100,000)
exists only when :meth:`LossChangeGP.dense_covariance` is asked for it.

``fit(..., solver="closed-form")`` evaluates the same likelihood with the same identities
and its gradient in closed form (:meth:`LossChangeGP.closed_form_objective`: two products
with an N x (d + M) matrix per step, no autograd graph) instead of through linear_operator's
generic operators and autograd: the objective and its gradient agree with GPyTorch's to
float64 rounding (about 1e-14 relative) and a step costs several times less at
N = 100,000, but the rounding differs, so a run is not bit-for-bit the default's.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import gpytorch
import numpy as np
import torch
from linear_operator.operators import DiagLinearOperator, LowRankRootAddedDiagLinearOperator, LowRankRootLinearOperator

__all__ = ["SOLVERS", "LossChangeGP", "FitResult", "greedy_select", "num_threads"]

DTYPE = torch.float64
SOLVERS = ("gpytorch", "closed-form")
# Below this many clients one Adam step is a handful of tiny (N x 15) matmuls, and
# waking a second BLAS / OpenMP thread costs more than the work (on a busy 2-core host we
# measured 1.5 ms per step with one thread and over 100 ms with two at N = 100).
SINGLE_THREAD_MAX_CLIENTS = 200_000


@contextlib.contextmanager
def num_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(n)`` and restore the previous value (``None``: unchanged)."""
    previous = torch.get_num_threads()
    if n is None or n == previous:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def threads_for(n_clients: int) -> int | None:
    """The thread count the fit uses for ``n_clients`` (``None``: torch's current setting)."""
    return 1 if n_clients <= SINGLE_THREAD_MAX_CLIENTS else None


@dataclass(frozen=True)
class FitResult:
    """What one fit did: Adam iterations, final and initial weighted negative log-likelihood, wall-clock seconds."""

    iterations: int
    nll: float
    seconds: float
    initial_nll: float = float("nan")


class LossChangeGP(gpytorch.Module):
    """``dl ~ N(mu, X^T X + noise^2 I)`` over N clients with learnable embeddings X (d x N).

    Parameters
    ----------
    n_clients : int
        N.
    rank : int
        d, the embedding dimension (the paper's d = 15).
    noise : float
        s_n, the fixed observation noise standard deviation (0.01 in the paper's code);
        it keeps Sigma positive definite even when every observed vector is constant.
    generator : torch.Generator
        A CPU generator; draws the initial embeddings from N(0, 1/d) (the official code's initialisation).
    device : torch.device, default the CPU
        Where the embeddings, the fit and its Adam state live (float64 there). The initial embeddings
        are drawn on the CPU and copied, so every device starts from the same X; what comes back to
        numpy (:attr:`embeddings`, the fit's objective values) is copied to the host.
    """

    def __init__(
        self, n_clients: int, rank: int, noise: float, *, generator: torch.Generator, device: torch.device | None = None
    ) -> None:
        super().__init__()
        self.n_clients = int(n_clients)
        self.rank = int(rank)
        self.noise = float(noise)
        dev = torch.device("cpu") if device is None else torch.device(device)
        root = torch.randn(self.n_clients, self.rank, generator=generator, dtype=DTYPE, device="cpu")
        root = (root / math.sqrt(self.rank)).to(dev)
        self.root = torch.nn.Parameter(root)  # row k is client k's embedding x_k, i.e. the root is X^T
        self.register_buffer("mean", torch.zeros(self.n_clients, dtype=DTYPE, device=dev))
        self.register_buffer("noise_diag", torch.full((self.n_clients,), self.noise**2, dtype=DTYPE, device=dev))

    @property
    def device(self) -> torch.device:
        """Where the GP's tensors live."""
        return self.root.device

    # -- the model --------------------------------------------------------------------
    def forward(self) -> gpytorch.distributions.MultivariateNormal:
        """The prior of one round's loss-change vector (Eq. 8 with the kernel of Eq. 14)."""
        covar = LowRankRootAddedDiagLinearOperator(
            LowRankRootLinearOperator(self.root), DiagLinearOperator(self.noise_diag)
        )
        return gpytorch.distributions.MultivariateNormal(self.mean, covar)

    def log_probs(self, values: torch.Tensor) -> torch.Tensor:
        """``log N(values_m | mu, Sigma)`` for each row of ``values`` (shape (M, N)), shape (M,).

        Complete rows share one call of the operator's ``inv_quad_logdet`` with the vectors
        as columns: a single d x d Cholesky factor serves them all
        (``MultivariateNormal.log_prob`` on a batch would first repeat the operator M times).

        NaN entries are clients that did not answer in that round: a row with missing
        entries contributes the exact marginal likelihood of its observed entries,
        ``log N(v_o | mu_o, X_o^T X_o + s_n^2 I)`` (the marginal of a Gaussian over a subset
        of its coordinates), all such rows in one batched Woodbury computation
        (:meth:`_partial_log_probs`).
        """
        mvn = self()
        missing = torch.isnan(values)
        complete = ~missing.any(dim=1)
        if bool(complete.all()):
            inv_quad, logdet = mvn.lazy_covariance_matrix.inv_quad_logdet(
                inv_quad_rhs=(values - mvn.loc).mT, logdet=True, reduce_inv_quad=False
            )
            return -0.5 * (inv_quad + logdet + self.n_clients * math.log(2 * math.pi))
        out = values.new_zeros(values.shape[0])
        if bool(complete.any()):
            diff = (values[complete] - mvn.loc).mT
            inv_quad, logdet = mvn.lazy_covariance_matrix.inv_quad_logdet(
                inv_quad_rhs=diff, logdet=True, reduce_inv_quad=False
            )
            out[complete] = -0.5 * (inv_quad + logdet + self.n_clients * math.log(2 * math.pi))
        partial = ~complete
        if bool(partial.any()):
            out[partial] = self._partial_log_probs(values[partial], missing[partial])
        return out

    def _partial_log_probs(
        self, values: torch.Tensor, missing: torch.Tensor, root: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The exact marginal log-likelihood of each row's observed entries, all rows in one batch.

        With D the noise diagonal, w = (observed) / D (0 for a missing client), r = v - mu
        (0 where missing) and A = I_d + X diag(w) X^T (one d x d matrix per row), the Woodbury
        identity and the matrix determinant lemma give, over the observed clients o,
        ``r_o^T K_o^{-1} r_o = sum(w r^2) - b^T A^{-1} b`` with ``b = X (w * r)`` and
        ``log det K_o = log det A + sum_o log D``: O(M N d^2) for M rows, never an n_o x n_o
        matrix and no loop over rows. A row with no observed entry contributes 0.
        """
        observed = (~missing).to(values.dtype)
        w = observed / self.noise_diag  # (M, N)
        r = torch.where(missing, torch.zeros_like(values), values - self.mean)
        root = self.root if root is None else root  # (N, d)
        eye = torch.eye(self.rank, dtype=values.dtype, device=values.device)
        A = eye + torch.einsum("nd,mn,ne->mde", root, w, root)  # (M, d, d)
        b = (w * r) @ root  # (M, d)
        chol = torch.linalg.cholesky(A)
        z = torch.cholesky_solve(b.unsqueeze(-1), chol).squeeze(-1)
        inv_quad = (w * r * r).sum(1) - (b * z).sum(1)
        logdet = 2 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(1)
        logdet = logdet + (observed * torch.log(self.noise_diag)).sum(1)
        n_obs = observed.sum(1)
        return -0.5 * (inv_quad + logdet + n_obs * math.log(2 * math.pi))

    def weighted_nll(self, values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``-sum_m weights_m log N(values_m | mu, Sigma)``: minus the objective Phi of Eq. (17)."""
        return -(weights * self.log_probs(values)).sum()

    def closed_form_objective(
        self, values: torch.Tensor, weights: torch.Tensor
    ) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        """:meth:`weighted_nll` and its gradient in X as a function of the current X, everything that does not
        depend on X computed once.

        With ``s^2`` the noise variance, ``R = X^T`` (N x d), ``A = I_d + R^T R / s^2`` and, for the
        complete vectors, residuals ``r_m = v_m - mu`` (rows of the M x N matrix r),
        ``b_m = R^T r_m``, ``z_m = A^{-1} b_m`` and ``W = sum_m w_m``, the Woodbury identity and the
        matrix determinant lemma give the objective

            -Phi = 1/2 sum_m w_m (r_m^T r_m / s^2 - b_m^T z_m / s^4 + log det A + N log(2 pi s^2)),

        (GPyTorch's ``LowRankRootAddedDiagLinearOperator`` computes the same quantities), and its
        gradient in R is

            G = R (W A^{-1} / s^2 + Z diag(w) Z^T / s^6) - r^T diag(w) Z^T / s^4,   Z = [z_1 .. z_M].

        Stacking ``H = [R, r^T]`` (N x (d + M)), a step is two products with H: ``H^T R`` gives
        ``R^T R`` and the ``b_m``, and ``H [K; C]`` gives G (computed as ``G^T`` from ``H^T``, stored
        row-major: :class:`_ClosedForm`); everything else is d x d. So a step
        costs 2 N d (d + M) multiply-adds, O(N (d + M)) memory, and no autograd graph.
        Vectors with missing entries add :meth:`_partial_log_probs` and its autograd gradient,
        as :meth:`log_probs` does.

        Returns
        -------
        callable
            ``f() -> (value, gradient)``: minus the objective of Eq. (17) (a 0-d tensor) and
            its gradient with respect to the root ``X^T`` (N x d), in one buffer that each call overwrites.
        """
        solver = _ClosedForm(self, values, weights)

        def value_and_grad() -> tuple[torch.Tensor, torch.Tensor]:
            with torch.no_grad():
                solver.x.copy_(self.root.mT)
            value, grad = solver.step()
            return value, grad.mT

        return value_and_grad

    # -- learning ---------------------------------------------------------------------
    def set_mean(self, values: np.ndarray | None, weights: np.ndarray | None = None) -> None:
        """Set mu to the weighted mean of ``values`` per client, or back to 0 when ``values`` is None.

        NaN entries (clients that did not answer) are left out of their client's mean; a
        client never observed gets mean 0.
        """
        with torch.no_grad():
            if values is None:
                self.mean.zero_()
            else:
                v = np.asarray(values, dtype=np.float64)
                w = np.asarray(weights, dtype=np.float64)
                if np.isfinite(v).all():
                    mean = w @ v / w.sum()
                else:
                    wm = w[:, None] * np.isfinite(v)
                    total = wm.sum(axis=0)
                    mean = np.divide((wm * np.nan_to_num(v)).sum(axis=0), total, out=np.zeros(v.shape[1]),
                                     where=total > 0)
                self.mean.copy_(torch.from_numpy(mean))

    def fit(
        self, values: np.ndarray, weights: np.ndarray, *, iterations: int, lr: float, solver: str = "gpytorch"
    ) -> FitResult:
        """Maximise ``sum_m weights_m log N(values_m | mu, Sigma)`` over X with Adam (Eqs. 16-17).

        Warm-started from the current X; a fresh Adam state per fit, as in the official code.

        Parameters
        ----------
        values : ndarray, shape (M, N)
            Loss-change vectors (NaN: a client that did not answer; see :meth:`log_probs`).
        weights : ndarray, shape (M,)
            Their discount weights gamma^age.
        iterations : int
            Adam steps.
        lr : float
            Adam's learning rate.
        solver : {"gpytorch", "closed-form"}, default "gpytorch"
            How the objective is evaluated: through the GPyTorch model (:meth:`weighted_nll`)
            or by :meth:`closed_form_objective` (the same value and gradient to rounding,
            several times faster per step at N = 100,000; not bit-for-bit the same run).
        """
        if solver not in SOLVERS:
            raise ValueError(f"LossChangeGP.fit: solver={solver!r}; expected one of {list(SOLVERS)}")
        start = time.perf_counter()
        v = torch.as_tensor(np.asarray(values, dtype=np.float64), device=self.device)
        w = torch.as_tensor(np.asarray(weights, dtype=np.float64), device=self.device)
        with num_threads(threads_for(self.n_clients)):
            closed = _ClosedForm(self, v, w) if solver == "closed-form" else None
            param = self.root if closed is None else closed.x  # Adam is elementwise: the same update either way
            optimizer = _adam(param, lr)
            initial = float("nan")
            for i in range(int(iterations)):
                optimizer.zero_grad(set_to_none=True)
                if closed is not None:
                    loss, param.grad = closed.step()
                else:
                    loss = self.weighted_nll(v, w)
                    loss.backward()
                if i == 0:
                    initial = float(loss.detach())  # the objective before any step, read from the first pass
                optimizer.step()
            if closed is not None:
                nll = float(closed.step()[0])  # (vectors with missing entries take their gradient by autograd)
                with torch.no_grad():
                    self.root.copy_(closed.x.mT)
            else:
                with torch.no_grad():
                    nll = float(self.weighted_nll(v, w))
        return FitResult(int(iterations), nll, time.perf_counter() - start, initial)

    # -- views ------------------------------------------------------------------------
    @property
    def embeddings(self) -> np.ndarray:
        """X, shape (d, N), a copy."""
        return self.root.detach().cpu().numpy().T.copy()

    def dense_covariance(self) -> np.ndarray:
        """Sigma = X^T X + s_n^2 I as a dense N x N array (for diagnostics at small N only)."""
        root = self.root.detach().cpu().numpy()
        cov = root @ root.T
        cov[np.diag_indices_from(cov)] += self.noise**2
        return cov


class _ClosedForm:
    """:meth:`LossChangeGP.closed_form_objective`'s step in the layout that suits its products.

    ``stacked`` is ``H^T = [X; r]`` ((d + Mc) x N, rows contiguous) and ``x``, its first d rows, is
    the X the step reads (a view: the fit runs Adam on it in place, so H never needs X copied
    in). A step is ``H^T X^T`` ((d + Mc) x d) and ``G^T = [K^T, -Z W / s^4] H^T`` (``Z W``:
    d x Mc, column m is ``w_m z_m``) into one reused d x N buffer. Measured at N = 1,000,000
    with one thread (``benchmarks/speed/bench_gp_step.txt``): a step of the N x d layout with a
    fresh N x d gradient (120 MB, and its page faults) each step took about twice as long. The
    rounding differs from that layout's, so a closed-form fit is not bit-for-bit the one of
    fedselect versions before it (the default solver's fits are unchanged).
    """

    def __init__(self, gp: LossChangeGP, values: torch.Tensor, weights: torch.Tensor) -> None:
        values = torch.as_tensor(values, dtype=DTYPE, device=gp.device)
        weights = torch.as_tensor(weights, dtype=DTYPE, device=gp.device)
        self.gp = gp
        missing = torch.isnan(values)
        complete = ~missing.any(dim=1)
        self.s2 = gp.noise**2
        d = gp.rank
        self.eye = torch.eye(d, dtype=DTYPE, device=gp.device)
        with torch.no_grad():
            resid = values[complete] - gp.mean  # (Mc, N)
            self.const = (resid * resid).sum(1) / self.s2 + gp.n_clients * math.log(2 * math.pi * self.s2)
            self.stacked = torch.empty(d + resid.shape[0], gp.n_clients, dtype=DTYPE, device=gp.device)
            self.stacked[d:] = resid
            self.stacked[:d] = gp.root.mT
        self.x = self.stacked[:d]
        self.grad = torch.empty_like(self.x)
        self.w = weights[complete]
        self.total_w = float(self.w.sum())  # once per fit
        partial = ~complete
        self.w_partial, self.v_partial, self.m_partial = weights[partial], values[partial], missing[partial]
        self.any_complete, self.any_partial = bool(complete.any()), bool(partial.any())

    def step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Minus the objective at ``x`` and its gradient in X ((d, N), the reused buffer)."""
        d, s2, w, grad = self.gp.rank, self.s2, self.w, self.grad
        value = self.x.new_zeros(())
        if not self.any_complete:
            grad.zero_()
        else:
            with torch.no_grad():
                products = self.stacked @ self.x.mT  # [X X^T; b^T]: (d + Mc) x d
                chol = torch.linalg.cholesky(self.eye + products[:d] / s2)
                b = products[d:]  # (Mc, d)
                z = torch.cholesky_solve(b.mT, chol)  # (d, Mc)
                quad = (b * z.mT).sum(1) / (s2 * s2)
                logdet = 2 * torch.log(torch.diagonal(chol)).sum()
                value = value + 0.5 * (w * (self.const - quad + logdet)).sum()
                wz = z * w  # (d, Mc): column m is w_m z_m
                k = torch.cholesky_inverse(chol) * (self.total_w / s2) + (wz @ z.mT) / s2**3
                torch.matmul(torch.cat([k.mT, -wz / (s2 * s2)], dim=1), self.stacked, out=grad)
        if self.any_partial:
            root = self.x.detach().mT.requires_grad_(True)
            part = -(self.w_partial * self.gp._partial_log_probs(self.v_partial, self.m_partial, root)).sum()
            (g_part,) = torch.autograd.grad(part, root)
            value = value + part.detach()
            grad.add_(g_part.mT)
        return value, grad


def _adam(param: torch.Tensor, lr: float) -> torch.optim.Optimizer:
    # The fused CPU kernel (torch >= 2.4) does Adam's update in one pass over the N x d
    # parameter instead of several elementwise passes.
    try:
        return torch.optim.Adam([param], lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam([param], lr=lr)


def greedy_select(
    embeddings: np.ndarray,
    noise: float,
    weights: np.ndarray,
    alpha: np.ndarray,
    n: int,
    *,
    posterior_noise: bool = False,
) -> np.ndarray:
    """Algorithm 1 of FedCor with mu = 0, never forming an N x N matrix.

    With prediction ``dl_k = mu_k - alpha_k sigma_k`` (Eq. 9) the posterior mean of
    ``sum_i p_i dl_i`` after conditioning on client k is ``const - score(k)``, so Eq. (10)
    picks ``k* = argmax_k score(k)`` over unselected k with

        score(k) = alpha_k * (sum_i p_i S_ik) / sqrt(S_kk)      (Lemma 2, Eqs. 12-13),

    and Eq. (11) updates ``S <- S - S[:, k*] S[k*, :] / S_{k*k*}`` (mu's update shifts
    every candidate's objective by the same constant, so mu never affects the choice).
    S is kept as ``Sigma - sum_j u_j u_j^T`` with ``u_j = S[:, k_j] / sqrt(S_{k_j k_j})``:

        S[:, k]        = X^T x_k + s_n^2 e_k - sum_j u_j u_j[k]
        sum_i p_i S_ik = (X p)^T x_k + s_n^2 p_k - sum_j (u_j^T p) u_j[k]
        S_kk           = ||x_k||^2 + s_n^2 - sum_j u_j[k]^2,

    so each pick costs O(N (d + C)).

    With ``posterior_noise`` (the official 2022 code) S starts from the noise-free
    ``X^T X`` and each pick conditions on a *noisy* observation of the chosen client:
    ``score(k) = alpha_k sqrt(S_kk) (sum_i p_i S_ik) / (S_kk + s_n^2)`` and
    ``S <- S - S[:, k] S[k, :] / (S_kk + s_n^2)``.

    Parameters
    ----------
    embeddings : ndarray, shape (d, N)
        X.
    noise : float
        s_n.
    weights : ndarray, shape (N,)
        p_k.
    alpha : ndarray, shape (N,)
        The annealing factors alpha_k = beta^tau_k.
    n : int
        C, how many clients to choose (at most N).
    posterior_noise : bool
        Condition on noisy observations (see above).

    Returns
    -------
    ndarray of int, shape (n,)
        The chosen clients in the order Algorithm 1 picked them.
    """
    X = np.asarray(embeddings, dtype=np.float64)
    p = np.asarray(weights, dtype=np.float64)
    a = np.asarray(alpha, dtype=np.float64)
    n_clients = X.shape[1]
    s2 = float(noise) ** 2
    diag_noise = 0.0 if posterior_noise else s2  # what Sigma's diagonal carries
    obs_noise = s2 if posterior_noise else 0.0  # what each conditioning observation adds
    cross = (X @ p) @ X + diag_noise * p  # sum_i p_i S_ik for every k
    var = np.einsum("ij,ij->j", X, X) + diag_noise  # S_kk
    tiny = np.finfo(np.float64).tiny
    us = np.empty((n, n_clients))
    open_ = np.ones(n_clients, dtype=bool)
    chosen = np.empty(n, dtype=np.int64)
    for j in range(n):
        sd = np.sqrt(np.maximum(var, 0.0))
        score = a * cross * sd / np.maximum(var + obs_noise, tiny)
        score[~open_] = -np.inf
        k = int(np.argmax(score))
        col = X.T @ X[:, k] - us[:j].T @ us[:j, k]
        col[k] += diag_noise
        u = col / math.sqrt(max(col[k] + obs_noise, tiny))
        us[j] = u
        cross -= (u @ p) * u
        var -= u * u
        open_[k] = False
        chosen[j] = k
    return chosen
