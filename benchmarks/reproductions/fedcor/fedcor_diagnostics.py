"""Why FedCor does (or does not) beat Random and Power-of-choice: measure its GP against the truth.

FedCor (Tang et al., CVPR 2022) rests on three claims that can be measured in a simulator:

1. **Covariance stationarity** (Sec. 4.5, Fig. 3, appendix D.3): the covariance Sigma^t of the
   all-client loss-change vector under a uniformly random selection changes slowly with t.
   Every ``--every`` rounds we draw ``--samples`` uniform selections of C clients from the
   current global model w^t (each one trial: the C clients train, their models are averaged,
   every client's loss is measured; ``oracle.trial``) and estimate Sigma^t from those vectors.
   We report the cosine similarity of Eq. (151) between consecutive estimates,
   ``tr(A^T B) / sqrt(tr(A^T A) tr(B^T B))`` (the square root the printed equation lacks; without
   it the value is not in [0, 1]), beside the *split-half ceiling*: the similarity of two
   estimates of the same Sigma^t from disjoint halves of the samples, which is what sampling
   noise alone allows.
2. **The GP learns Sigma** (Sec. 4.4, Eq. 17): the cosine similarity between the GP's covariance
   ``X^T X + s_n^2 I`` used at round t and the sampled Sigma^t, and between their correlation
   matrices' off-diagonal entries.
3. **The GP predicts loss changes** (Lemma 1, Algorithm 1): for every round t the true
   loss-change vector ``dl^t = l(w^{t+1}) - l(w^t)`` (every client's held-out loss, measured
   outside the selector; it never enters the GP) is scored under the GP the selector used at
   round t: the log-likelihood per client of ``N(mu, X^T X + s_n^2 I)``, beside the same Gaussian
   without its correlations, ``N(mu, diag(X^T X) + s_n^2 I)`` (what correlations add), and the
   conditional fit: the
   posterior mean of the *unselected* clients' changes given the selected clients' changes
   (R^2 against the truth, and log-likelihood per client against the diagonal model, for which
   observing some clients says nothing about the others).

The run is FedCor with the preset's settings (``fedselect reproduce fedcor-fmnist-<setting>``),
wrapped in a subclass that calls the oracle before each selection. Those extra calls (all-client
losses every round, the stationarity trials) are paid and recorded in this run's costs, so this
run's cost figures are not FedCor's; its training trajectory is (the oracle's minibatch and
dropout streams are per round, so extra trials do not shift them). The raw record of a run goes to
``<out>/<setting>-seed<seed>.npz`` as soon as it ends (1.8 MB: every round's GP and all-client
losses, every sampled loss-change vector); the report reads only its compact summary
``<out>/<setting>-seed<seed>.summary.npz`` (about 0.1 MB: the statistics above per round and
checkpoint, and the three covariances the heatmaps draw), which is rebuilt from the raw record
whenever that is present. The figures and ``<out>/DIAGNOSTICS.md`` are rebuilt from every summary.
The repository keeps the summaries only; the raw records of the recorded runs are in git history
(:data:`RAW_COMMIT`).

Usage::

    python -m benchmarks.reproductions.fedcor.fedcor_diagnostics --settings dir 2spc --seed 0 --rounds 200 \\
        --every 10 --samples 200
    python -m benchmarks.reproductions.fedcor.fedcor_diagnostics --settings dir --seed 0 --rounds 200 --every 10 \\
        --samples 200 --variant readme2023 --fedcor-params schedule=readme2023,update_mean=True,beta=0.95
    python -m benchmarks.reproductions.fedcor.fedcor_diagnostics --report-only
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

ROOT = Path(__file__).resolve().parent / "diagnostics"
# The last commit holding the raw records of the recorded runs, as benchmarks/results/fedcor-diagnostics/*.npz.
RAW_COMMIT = "8c01308d8789b5d0837c994e4268a227d853e4a5"
SCORES = ("ll_gp", "ll_diag", "r2_cond", "ll_cond_gp", "ll_cond_diag")  # predictive_scores' keys


# -- the statistics -----------------------------------------------------------------------
def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two matrices, Eq. (151) of FedCor's appendix D.3 with its square root."""
    den = np.sqrt(np.sum(a * a) * np.sum(b * b))
    return float(np.sum(a * b) / den) if den > 0 else float("nan")


def offdiag_corr(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation between the off-diagonal entries of two correlation matrices."""

    def corr(c: np.ndarray) -> np.ndarray:
        d = np.sqrt(np.clip(np.diag(c), 1e-300, None))
        return c / np.outer(d, d)

    iu = np.triu_indices(a.shape[0], 1)
    x, y = corr(a)[iu], corr(b)[iu]
    if x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def gaussian_loglik(x: np.ndarray, mean: np.ndarray, cov: np.ndarray) -> float:
    """log N(x; mean, cov) per dimension (nats)."""
    L = np.linalg.cholesky(cov)
    z = np.linalg.solve(L, x - mean)
    n = x.shape[0]
    return float((-0.5 * z @ z - np.log(np.diag(L)).sum() - 0.5 * n * np.log(2 * np.pi)) / n)


def predictive_scores(delta: np.ndarray, mean: np.ndarray, cov: np.ndarray, chosen: np.ndarray) -> dict[str, float]:
    """Score one true loss-change vector under the GP and under the GP without correlations (its diagonal)."""
    n = delta.shape[0]
    diag = np.diag(np.diag(cov))
    out = {
        "ll_gp": gaussian_loglik(delta, mean, cov),
        "ll_diag": gaussian_loglik(delta, mean, diag),
    }
    rest = np.setdiff1d(np.arange(n), chosen)
    S, R = chosen, rest
    K_ss = cov[np.ix_(S, S)]
    K_rs = cov[np.ix_(R, S)]
    gain = np.linalg.solve(K_ss, K_rs.T).T
    post_mean = mean[R] + gain @ (delta[S] - mean[S])
    post_cov = cov[np.ix_(R, R)] - gain @ K_rs.T
    post_cov = 0.5 * (post_cov + post_cov.T)
    resid = delta[R] - post_mean
    base = delta[R] - delta[R].mean()
    out["r2_cond"] = float(1 - resid @ resid / max(base @ base, 1e-300))
    out["ll_cond_gp"] = gaussian_loglik(delta[R], post_mean, post_cov)
    out["ll_cond_diag"] = gaussian_loglik(delta[R], mean[R], diag[np.ix_(R, R)])
    return out


# -- the run ---------------------------------------------------------------------------------
def run(
    setting: str,
    seed: int,
    rounds: int,
    every: int,
    samples: int,
    threads: int,
    out: Path,
    variant: str = "",
    extra: dict | None = None,
) -> Path:
    import torch

    from fedselect import FederatedTrainer
    from fedselect.data import make_federation
    from fedselect.presets import get_preset
    from fedselect.selectors.fedcor import FedCorSelector

    preset = get_preset(f"fedcor-fmnist-{setting}")
    _, params = preset.selectors["FedCor"]
    params = {**params, **(extra or {})}
    torch.set_num_threads(threads)
    fed = make_federation(random_state=seed, **preset.federation)
    n_clients = fed.n_clients
    c = int(preset.trainer["clients_per_round"])
    checkpoints = set(range(0, rounds, every))
    probe = np.random.RandomState(10_000 + seed)  # the trials' own stream, not the selector's

    log: dict[str, list] = {
        "losses": [],
        "gp_root": [],
        "gp_mean": [],
        "chosen": [],
        "sigma_round": [],
        "sigma_samples": [],
    }

    class ObservedFedCor(FedCorSelector):
        def _select(self, n, *, round, oracle):
            log["losses"].append(np.asarray(oracle.losses(np.arange(n_clients)), dtype=float))
            if round in checkpoints:
                vecs = [oracle.trial(np.sort(probe.choice(n_clients, n, replace=False))) for _ in range(samples)]
                log["sigma_round"].append(round)
                log["sigma_samples"].append(np.asarray(vecs, dtype=np.float32))
            sel = super()._select(n, round=round, oracle=oracle)
            if self.fit_log_:
                log["gp_root"].append(self.embeddings_.astype(np.float32))  # X; Sigma = X^T X + s_n^2 I
                log["gp_mean"].append(self._gp.mean.numpy().astype(np.float32))
            else:
                log["gp_root"].append(np.full((self.rank_, n_clients), np.nan, dtype=np.float32))
                log["gp_mean"].append(np.zeros(n_clients, dtype=np.float32))
            log["chosen"].append(np.asarray(sel.clients, dtype=np.int64))
            return sel

    trainer_kwargs = {**preset.trainer, "rounds": rounds + 1}
    start = time.perf_counter()
    trainer = FederatedTrainer(
        selector=ObservedFedCor(**params), random_state=seed, progress=sys.stderr.isatty(), **trainer_kwargs
    ).fit(fed)
    seconds = time.perf_counter() - start
    losses = np.stack(log["losses"])  # l(w^t), t = 0..rounds
    commit = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
    ).stdout.strip()
    chosen = np.full((len(log["chosen"]), c), -1, dtype=np.int64)
    for i, ids in enumerate(log["chosen"]):
        chosen[i, : len(ids)] = ids
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{_tag(setting, variant)}-seed{seed}.npz"
    np.savez_compressed(
        path,
        losses=losses,
        gp_root=np.stack(log["gp_root"]),
        noise=np.asarray(float(params.get("noise", 0.01))),
        gp_mean=np.stack(log["gp_mean"]),
        chosen=chosen,
        sigma_round=np.asarray(log["sigma_round"]),
        sigma_samples=np.stack(log["sigma_samples"]),
        accuracy=np.asarray([r.test_accuracy for r in trainer.history_.rounds], dtype=float),
        labels=fed.label_histogram().argmax(1),
        fit_rounds=np.asarray([f.round for f in trainer.selector_.fit_log_]),
        fit_nll=np.asarray([f.nll for f in trainer.selector_.fit_log_]),
        meta=np.asarray(
            [
                _tag(setting, variant),
                str(seed),
                str(rounds),
                str(every),
                str(samples),
                commit,
                f"{seconds:.0f}",
                " ".join(sys.argv),
            ]
        ),
    )
    print(
        f"[{time.strftime('%H:%M:%S')}] {setting} seed {seed}: {rounds} rounds in {seconds:.0f} s -> {path}", flush=True
    )
    return path


# -- the report ------------------------------------------------------------------------------
def _gp_cov(root: np.ndarray, noise: float) -> np.ndarray:
    """The GP's covariances X^T X + s_n^2 I from the roots X, shape (rounds, d, N) -> (rounds, N, N)."""
    root = root.astype(float)
    return np.einsum("tdi,tdj->tij", root, root) + noise**2 * np.eye(root.shape[2])


def _heat_rounds(sigma_rounds: np.ndarray) -> list[int]:
    """The three checkpoints the heatmaps show: first, middle, last."""
    sr = [int(t) for t in sigma_rounds]
    return [sr[0], sr[len(sr) // 2], sr[-1]]


def analyse(path: Path) -> dict[str, object]:
    """Every statistic of the report from a run's raw record (``<tag>-seed<seed>.npz``)."""
    z = np.load(path)
    losses, gp_mean, chosen = z["losses"], z["gp_mean"], z["chosen"]
    noise = float(z["noise"])
    gp_cov = _gp_cov(z["gp_root"], noise)  # the GP's covariance at each round is X^T X + s_n^2 I
    deltas = np.diff(losses, axis=0)  # dl^t for t = 0..T-1
    per_round = []
    for t in range(deltas.shape[0]):
        cov = gp_cov[t].astype(float)
        if not np.isfinite(cov).all():
            continue
        ids = chosen[t][chosen[t] >= 0]
        per_round.append({"round": t, **predictive_scores(deltas[t], gp_mean[t].astype(float), cov, ids)})
    sig_rounds = z["sigma_round"]
    sig = z["sigma_samples"].astype(float)  # (checkpoints, samples, N)
    emp = [np.cov(s, rowvar=False) for s in sig]
    half = sig.shape[1] // 2
    ceiling = [cosine(np.cov(s[:half], rowvar=False), np.cov(s[half:], rowvar=False)) for s in sig]
    stationarity = [cosine(emp[i], emp[i + 1]) for i in range(len(emp) - 1)]
    gp_vs_emp = []
    for r, e in zip(sig_rounds, emp):
        cov = gp_cov[int(r)].astype(float)
        if np.isfinite(cov).all():
            gp_vs_emp.append((int(r), cosine(cov, e), offdiag_corr(cov, e), float(np.trace(cov) / np.trace(e))))
    picks = _heat_rounds(sig_rounds)
    meta = [str(m) for m in z["meta"]]
    return {
        "meta": z["meta"],
        "setting": meta[0],
        "seed": int(meta[1]),
        "rounds": int(meta[2]),
        "every": int(meta[3]),
        "samples": int(meta[4]),
        "commit": meta[5],
        "seconds": meta[6],
        "command": meta[7],
        "per_round": per_round,
        "sigma_rounds": sig_rounds,
        "ceiling": ceiling,
        "stationarity": stationarity,
        "gp_vs_emp": gp_vs_emp,
        "labels": z["labels"],
        "accuracy": z["accuracy"],
        "fit_rounds": z["fit_rounds"],
        "fit_nll": z["fit_nll"],
        # What the heatmaps draw: the sampled Sigma^t and the GP's root at three checkpoints.
        "heat_rounds": np.asarray(picks),
        "heat_emp": np.stack([emp[[int(t) for t in sig_rounds].index(t)] for t in picks]),
        "heat_root": z["gp_root"][picks],
        "noise": noise,
    }


def summarise(result: dict[str, object]) -> dict[str, np.ndarray]:
    """The compact summary of :func:`analyse`'s result: exactly what the report and its figures read.

    The sampled covariances are symmetric (``np.cov``), so their upper triangles are stored; the
    GP's covariances are stored as their float32 roots, as the raw record holds them.
    """
    pr = result["per_round"]
    iu = np.triu_indices(result["heat_emp"].shape[1])
    return {
        "meta": np.asarray(result["meta"]),
        "round": np.asarray([p["round"] for p in pr], dtype=np.int64),
        **{k: np.asarray([p[k] for p in pr], dtype=float) for k in SCORES},
        "sigma_round": np.asarray(result["sigma_rounds"], dtype=np.int64),
        "ceiling": np.asarray(result["ceiling"], dtype=float),
        "stationarity": np.asarray(result["stationarity"], dtype=float),
        "gp_vs_emp": np.asarray(result["gp_vs_emp"], dtype=float).reshape(-1, 4),
        "labels": np.asarray(result["labels"]),
        "accuracy": np.asarray(result["accuracy"], dtype=float),
        "fit_rounds": np.asarray(result["fit_rounds"]),
        "fit_nll": np.asarray(result["fit_nll"]),
        "heat_rounds": np.asarray(result["heat_rounds"], dtype=np.int64),
        "heat_emp_triu": np.stack([e[iu] for e in result["heat_emp"]]),
        "heat_root": np.asarray(result["heat_root"]),
        "noise": np.asarray(float(result["noise"])),
    }


def load_summary(path: Path) -> dict[str, object]:
    """A summary written by :func:`summarise`, in the form :func:`analyse` returns (what :func:`report` reads)."""
    z = np.load(path, allow_pickle=False)
    meta = [str(m) for m in z["meta"]]
    n = z["labels"].shape[0]
    iu = np.triu_indices(n)
    emp = []
    for tri in z["heat_emp_triu"]:
        e = np.zeros((n, n))
        e[iu] = tri
        e.T[iu] = tri
        emp.append(e)
    return {
        "meta": z["meta"],
        "setting": meta[0],
        "seed": int(meta[1]),
        "rounds": int(meta[2]),
        "every": int(meta[3]),
        "samples": int(meta[4]),
        "commit": meta[5],
        "seconds": meta[6],
        "command": meta[7],
        "per_round": [{"round": int(t), **{k: float(z[k][i]) for k in SCORES}} for i, t in enumerate(z["round"])],
        "sigma_rounds": z["sigma_round"],
        "ceiling": [float(x) for x in z["ceiling"]],
        "stationarity": [float(x) for x in z["stationarity"]],
        "gp_vs_emp": [(int(g[0]), float(g[1]), float(g[2]), float(g[3])) for g in z["gp_vs_emp"]],
        "labels": z["labels"],
        "accuracy": z["accuracy"],
        "fit_rounds": z["fit_rounds"],
        "fit_nll": z["fit_nll"],
        "heat_rounds": z["heat_rounds"],
        "heat_emp": np.stack(emp),
        "heat_root": z["heat_root"],
        "noise": float(z["noise"]),
    }


def _summary_path(raw: Path) -> Path:
    return raw.with_name(raw.stem + ".summary.npz")


def _median(values: list[float]) -> str:
    v = np.asarray([x for x in values if np.isfinite(x)])
    return f"{np.median(v):.3f}" if v.size else "-"


def report(out: Path) -> None:
    for raw in sorted(out.glob("*-seed*[0-9].npz")):  # a raw record, when present, is the source of its summary
        np.savez_compressed(_summary_path(raw), **summarise(analyse(raw)))
    results = [load_summary(p) for p in sorted(out.glob("*-seed*.summary.npz"))]
    if not results:
        print(f"no diagnostics runs under {out}")
        return
    lines = [
        "# FedCor diagnostics: is the GP right?",
        "",
        "Generated by `python -m benchmarks.reproductions.fedcor.fedcor_diagnostics --report-only` from the runs "
        "listed below "
        "(see the script's docstring for the definitions). Cosine similarity is Eq. (151) of FedCor's "
        "appendix D.3 with the square root; the *split-half ceiling* is the similarity of two estimates of "
        "the same Sigma^t from disjoint halves of the samples (sampling noise alone). Log-likelihoods are "
        "nats per client; *diag* is the GP's Gaussian without its correlations (its diagonal), so GP − diag "
        "is what the learned correlations add.",
        "",
        "| setting | seed | rounds | stationarity cos(Σ^t, Σ^t+Δ) median | split-half ceiling median | "
        "GP vs sampled Σ: cos median | corr. of off-diagonal correlations median | tr(GP) / tr(Σ^t) median | "
        "log-lik GP − diag, median | conditional R² of unselected clients, median | "
        "conditional log-lik GP − diag, median |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        pr = r["per_round"]
        lines.append(
            f"| {r['setting']} | {r['seed']} | {r['rounds']} | {_median(r['stationarity'])} | "
            f"{_median(r['ceiling'])} | {_median([g[1] for g in r['gp_vs_emp']])} | "
            f"{_median([g[2] for g in r['gp_vs_emp']])} | {_median([g[3] for g in r['gp_vs_emp']])} | "
            f"{_median([p['ll_gp'] - p['ll_diag'] for p in pr])} | {_median([p['r2_cond'] for p in pr])} | "
            f"{_median([p['ll_cond_gp'] - p['ll_cond_diag'] for p in pr])} |"
        )
    lines += [""]
    for r in results:
        tag = f"{r['setting']}-seed{r['seed']}"
        _figure(r, out / f"{tag}.png")
        _heatmaps(r, out / f"{tag}-covariance.png")
        lines += [
            f"## {r['setting']}, seed {r['seed']}",
            "",
            f"`{r['command']}` at commit {r['commit']}, {r['seconds']} s; Sigma^t sampled every {r['every']} "
            f"rounds from {r['samples']} uniform selections.",
            "",
            "| round | cos(Σ^t, Σ^t+Δ) | split-half ceiling | GP vs Σ^t cos | off-diag corr | tr(GP) / tr(Σ^t) |",
            "|---|---|---|---|---|---|",
        ]
        gp = {g[0]: g for g in r["gp_vs_emp"]}
        for i, t in enumerate(r["sigma_rounds"]):
            st = f"{r['stationarity'][i]:.3f}" if i < len(r["stationarity"]) else ""
            g = gp.get(int(t))
            lines.append(
                f"| {int(t)} | {st} | {r['ceiling'][i]:.3f} | {g[1]:.3f} | {g[2]:.3f} | {g[3]:.2f} |"
                if g
                else f"| {int(t)} | {st} | {r['ceiling'][i]:.3f} | (warm-up) | | |"
            )
        lines += ["", f"![diagnostics]({tag}.png)", "", f"![covariance]({tag}-covariance.png)", ""]
    (out / "DIAGNOSTICS.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[: 8 + len(results)]))
    print(f"wrote {out / 'DIAGNOSTICS.md'}")


def _figure(r: dict, path: Path) -> None:
    pr = r["per_round"]
    t = np.array([p["round"] for p in pr])
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.6), constrained_layout=True)
    ax = axes[0]
    sr = r["sigma_rounds"]
    ax.plot(sr[:-1], r["stationarity"], "o-", label="cos(Σ^t, Σ^t+Δ)")
    ax.plot(sr, r["ceiling"], "s--", label="split-half ceiling")
    if r["gp_vs_emp"]:
        g = np.array(r["gp_vs_emp"])
        ax.plot(g[:, 0], g[:, 1], "^-", label="GP vs Σ^t")
        ax.plot(g[:, 0], g[:, 2], "v:", label="GP vs Σ^t (off-diag corr.)")
    ax.set(xlabel="round", ylabel="similarity", title="stationarity and GP fit", ylim=(-0.1, 1.02))
    ax.legend(fontsize="x-small")
    ax = axes[1]
    ax.plot(t, [p["ll_gp"] - p["ll_diag"] for p in pr], lw=0.8, label="joint: GP − diag")
    ax.plot(t, [p["ll_cond_gp"] - p["ll_cond_diag"] for p in pr], lw=0.8, label="unselected | selected: GP − diag")
    ax.axhline(0, color="k", lw=0.5)
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set(xlabel="round", ylabel="nats / client (symlog)", title="held-out log-likelihood gain")
    ax.legend(fontsize="x-small")
    ax = axes[2]
    ax.plot(t, [p["r2_cond"] for p in pr], lw=0.8)
    ax.axhline(0, color="k", lw=0.5)
    ax.set(xlabel="round", ylabel="R²", title="unselected clients' Δl from selected (GP posterior)", ylim=(-1, 1))
    ax = axes[3]
    ax.plot(np.arange(len(r["accuracy"])), r["accuracy"], lw=0.8)
    ax.set(xlabel="round", ylabel="test accuracy", title=f"FedCor run ({r['setting']}, seed {r['seed']})")
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _heatmaps(r: dict, path: Path) -> None:
    order = np.argsort(r["labels"], kind="stable")
    picks = [int(t) for t in r["heat_rounds"]]
    gp_cov = _gp_cov(r["heat_root"], r["noise"])
    fig, axes = plt.subplots(2, 3, figsize=(12, 7.6), constrained_layout=True)

    def corr(c: np.ndarray) -> np.ndarray:
        d = np.sqrt(np.clip(np.diag(c), 1e-300, None))
        return (c / np.outer(d, d))[np.ix_(order, order)]

    for j, t in enumerate(picks):
        e = r["heat_emp"][j]
        axes[0, j].imshow(corr(e), cmap="RdBu_r", vmin=-1, vmax=1)
        axes[0, j].set_title(f"sampled Σ^t correlation, round {int(t)}", fontsize="small")
        g = gp_cov[j]
        if np.isfinite(g).all():
            im = axes[1, j].imshow(corr(g), cmap="RdBu_r", vmin=-1, vmax=1)
            axes[1, j].set_title(f"FedCor GP correlation, round {int(t)}", fontsize="small")
        else:
            axes[1, j].set_title(f"round {int(t)}: GP not fitted yet", fontsize="small")
        for ax in axes[:, j]:
            ax.set_xticks([])
            ax.set_yticks([])
    fig.colorbar(im, ax=axes, shrink=0.6, label="correlation")
    fig.suptitle(f"{r['setting']}, seed {r['seed']}: clients sorted by their main label")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _tag(setting: str, variant: str) -> str:
    return f"{setting}-{variant}" if variant else setting


def _parse_params(text: str) -> dict:
    """``"a=1,b=True,c=x"`` -> ``{"a": 1, "b": True, "c": "x"}``."""
    import ast

    out: dict = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        try:
            out[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            out[key.strip()] = value.strip()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--settings", nargs="+", default=["dir", "2spc"], choices=["2spc", "1spc", "dir"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=200, help="rounds to run (default 200)")
    ap.add_argument("--every", type=int, default=20, help="rounds between Sigma^t estimates (default 20)")
    ap.add_argument("--samples", type=int, default=200, help="uniform selections per Sigma^t (default 200)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT)
    ap.add_argument("--report-only", action="store_true", help="rebuild the report from saved runs")
    ap.add_argument("--variant", default="", help="a name for --fedcor-params (part of the output file name)")
    ap.add_argument(
        "--fedcor-params",
        default="",
        help="FedCor parameters over the preset's, e.g. schedule=readme2023,update_mean=True,beta=0.95",
    )
    args = ap.parse_args()
    for name, value, low in (("rounds", args.rounds, 2), ("every", args.every, 1), ("samples", args.samples, 4)):
        if value < low:
            ap.error(f"--{name} must be >= {low}, got {value}")
    if not args.report_only:
        for setting in args.settings:
            if args.fedcor_params and not args.variant:
                ap.error("--fedcor-params needs a --variant name")
            raw = args.out / f"{_tag(setting, args.variant)}-seed{args.seed}.npz"
            if raw.exists() or _summary_path(raw).exists():
                print(f"{setting} seed {args.seed}: already done, skipped")
                continue
            run(
                setting,
                args.seed,
                args.rounds,
                args.every,
                args.samples,
                args.threads,
                args.out,
                args.variant,
                _parse_params(args.fedcor_params),
            )
    report(args.out)


if __name__ == "__main__":
    main()
