"""
Your own model
==============

The simulator trains any ``torch.nn.Module``. This tutorial covers what changes when the
model is yours: giving the trainer a module *class* (built and seeded per run) or a
module *instance* (used as given, e.g. pretrained) and getting the trained weights back
into a module; what happens to batch norm's running statistics when clients differ in
their inputs; regression with ``loss="mse"`` and with a per-sample loss of your own,
which loss-based selectors then rank clients by; and local SGD with momentum.
"""

# %%
# A model of our own
# ------------------
# The trainer calls a model *builder* as ``model(input_shape, n_outputs,
# **model_params)``, so a module class with that signature is a builder. ``input_shape``
# is one sample's shape (``(1, 8, 8)`` for digits) and ``n_outputs`` the federation's
# number of classes (or regression targets). ``norm`` picks an optional normalisation of
# the inputs; we use it for batch norm below.

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import fedselect
from fedselect.data import Federation, iid_partition, load_digits_data
from fedselect.plotting import plot_accuracy

torch.set_num_threads(1)  # models this small train fastest on one thread


class DigitNet(nn.Module):
    def __init__(self, input_shape, n_outputs, hidden=64, norm=None):
        super().__init__()
        width = int(np.prod(input_shape))
        layers = [nn.Flatten()]
        if norm == "batch":
            layers.append(nn.BatchNorm1d(width))
        elif norm == "layer":
            layers.append(nn.LayerNorm(width))
        layers += [nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, n_outputs)]
        self.body = nn.Sequential(*layers)

    def forward(self, x):
        return self.body(x)


fed = fedselect.make_federation("digits", partition="shards", n_clients=20, shards_per_client=2, random_state=0)
print(fed.summary())
settings = dict(clients_per_round=4, rounds=30, local_epochs=1, batch_size=16, lr=0.1, n_threads=1)

# %%
# A class, or an instance?
# ------------------------
# ``model=DigitNet`` (the class): every run builds a fresh model under its
# ``random_state``, so each seed starts from its own initial weights and, within a
# seed, every scheme starts from the same. This is what comparisons over seeds want.
#
# ``model=net`` (an instance): the module's current weights are the starting point
# w^0, *as given*. ``random_state`` does not re-initialise it, so every seed starts from
# the same weights, and ``fit`` never modifies it (training is functional; the result is
# in ``trainer.parameters_`` and ``trainer.buffers_``). This is what a pretrained model
# wants. Here the server "pretrains" on a small public sample: 300 images of the digits
# 0 to 4 only, with a plain torch loop.

public = np.flatnonzero(fed.y < 5)[:300]
X_pub, y_pub = torch.from_numpy(fed.X[public]), torch.from_numpy(fed.y[public])
torch.manual_seed(0)
net = DigitNet(fed.input_shape, fed.n_outputs)
optimiser = torch.optim.SGD(net.parameters(), lr=0.1)
for _epoch in range(20):
    for batch in torch.randperm(len(public)).split(32):
        optimiser.zero_grad()
        F.cross_entropy(net(X_pub[batch]), y_pub[batch]).backward()
        optimiser.step()
pretrained = {k: v.clone() for k, v in net.state_dict().items()}
with torch.no_grad():
    start_accuracy = (net(torch.from_numpy(fed.X_test)).argmax(1).numpy() == fed.y_test).mean()
print(f"the pretrained net alone: test accuracy {start_accuracy:.3f} (it knows 5 of the 10 digits)")

from_scratch, from_pretrained = [], []
for seed in range(3):
    from_scratch.append(fedselect.FederatedTrainer(model=DigitNet, random_state=seed, **settings).fit(fed))
    from_pretrained.append(fedselect.FederatedTrainer(model=net, random_state=seed, **settings).fit(fed))
for name, runs in (("class, built per seed", from_scratch), ("pretrained instance", from_pretrained)):
    print(f"{name:>22}: accuracy after round 0 {[round(t.history_.rounds[0].test_accuracy, 3) for t in runs]}, "
          f"rounds to 80 % {[t.history_.rounds_to_accuracy(0.8) for t in runs]}")
print("the instance is unchanged by fit:", all(torch.equal(pretrained[k], v) for k, v in net.state_dict().items()))

# %%
# The three pretrained runs start from the same weights, which already know half of the
# digits; the class-built runs start from three different random initialisations, and
# their accuracy after the first round varies accordingly. The rounds to 80 % above say
# how much the head start is worth on this federation.
#
# ``trainer.parameters_`` is the final global model flattened in the order of
# ``module.parameters()``, so :func:`torch.nn.utils.vector_to_parameters` puts it back
# into a module (and ``load_state_dict`` the ``buffers_``, for a model with batch norm):

trained = DigitNet(fed.input_shape, fed.n_outputs)
nn.utils.vector_to_parameters(torch.from_numpy(from_pretrained[0].parameters_), trained.parameters())
with torch.no_grad():
    accuracy = (trained(torch.from_numpy(fed.X_test)).argmax(1).numpy() == fed.y_test).mean()
print(f"the rebuilt module's test accuracy: {accuracy:.4f}; the history's last: "
      f"{from_pretrained[0].history_.final_accuracy():.4f}")

# %%

fig, ax = plt.subplots(figsize=(10, 4.2), constrained_layout=True)
plot_accuracy({"DigitNet class (new weights per seed)": [t.history_ for t in from_scratch],
               "pretrained DigitNet instance": [t.history_ for t in from_pretrained]},
              target=0.8, ax=ax, title="digits, 20 clients with 2 shards, 4 per round, random selection, 3 seeds",
              setting=False)
plt.show()

# %%
# Batch norm: what happens to the running statistics
# --------------------------------------------------
# A batch norm layer normalises with the minibatch's mean and variance while training,
# and keeps running averages of them (its *buffers*) for evaluation. In the batched
# engine each chosen client updates its own copy of the buffers during its local steps,
# starting from the global ones; the server then sets the global buffers to the weighted
# mean of the reporting clients' buffers, with the weights it averages the parameters
# with (FedAvg of buffers, :func:`fedselect.simulation.aggregate_buffers`). The test set is
# evaluated in eval mode with those global statistics.
#
# That is harmless when clients draw their inputs from one distribution. Here they do
# not: ten clinics each hold an IID tenth of digits, but each clinic's scanner adds its
# own brightness offset (from -1 to +1 standard deviation of the pixels) and contrast
# (x1.5 down to x0.5). The test images are unaltered.

X, y, X_test, y_test = load_digits_data()
offsets = np.linspace(-1.0, 1.0, 10, dtype=np.float32)
gains = np.linspace(1.5, 0.5, 10, dtype=np.float32)
clinics = [TensorDataset(torch.from_numpy(gains[k] * X[idx] + offsets[k]), torch.from_numpy(y[idx]))
           for k, idx in enumerate(iid_partition(y, 10, random_state=0))]
scanners = Federation.from_datasets(clinics, (X_test, y_test), name="digits, 10 clinics, one scanner each")

runs = {}
for norm in ("batch", "layer", None):
    runs[norm] = fedselect.FederatedTrainer(model=DigitNet, model_params={"norm": norm}, clients_per_round=3,
                                            rounds=30, batch_size=16, lr=0.05, divergence=None, random_state=0,
                                            n_threads=1).fit(scanners)
    h = runs[norm].history_
    print(f"norm={norm!s:>5}: final test accuracy {h.final_accuracy():.3f}, best {h.best_accuracy():.3f}, "
          f"buffers {list(runs[norm].buffers_)}")

# %%
# (``divergence=None`` lets the batch norm run finish: its test loss rises above ten
# times the initial one in some rounds, which by default stops a run as diverged.)
#
# Where do the global statistics end up? Averaged over the 64 pixels, each clinic's
# inputs have about the mean of its offset. In a round, each chosen clinic's copy of the
# running mean moves from the global one toward its own data's mean (an exponential
# average with batch norm's default momentum 0.1: over its 9 local steps, 1 - 0.9^9 =
# 61 % of the way), and the server averages the chosen clinics' copies. So the global
# statistics are mostly those of the last round's three clinics, with a fading memory of
# earlier rounds, and they change with every round's draw:

bn = runs["batch"]
running_mean = bn.buffers_["body.1.running_mean"]
clinic_means = np.array([scanners.X[idx].mean() for idx in scanners.client_indices])
last = bn.history_.rounds[-1].clients
print("each clinic's mean input:", " ".join(f"{m:+.2f}" for m in clinic_means))
print(f"global running mean (pixel average) {running_mean.mean():+.2f}; clinics of the last round {last} "
      f"have mean {clinic_means[last].mean():+.2f}; all clinics {clinic_means.mean():+.2f}")

# %%
# Every round the model trains on inputs normalised by each clinic's *own* batch
# statistics, then is evaluated with statistics averaged over a few clinics, which match
# neither the test images nor most clinics. Rebuilding the module from ``parameters_``
# and ``buffers_`` shows it clinic by clinic: with the global statistics, accuracy on the
# clinics' own data is low; with each clinic's own statistics put into the buffers (what
# FedBN, Li et al. 2021, does by keeping batch norm local), the same weights do well.


def rebuild(trainer, norm):
    module = DigitNet(scanners.input_shape, scanners.n_outputs, norm=norm)
    nn.utils.vector_to_parameters(torch.from_numpy(trainer.parameters_), module.parameters())
    if trainer.buffers_:
        module.load_state_dict({**module.state_dict(), **{k: torch.from_numpy(v) for k, v in trainer.buffers_.items()}})
    return module.eval()


def clinic_accuracy(module, idx, own_statistics=False):
    inputs = torch.from_numpy(scanners.X[idx])
    if own_statistics:
        flat = inputs.flatten(1)
        module.body[1].running_mean.copy_(flat.mean(0))
        module.body[1].running_var.copy_(flat.var(0, unbiased=False))
    with torch.no_grad():
        return float((module(inputs).argmax(1).numpy() == scanners.y[idx]).mean())


accuracy = {
    "batch norm, global statistics": [clinic_accuracy(rebuild(bn, "batch"), idx) for idx in scanners.client_indices],
    "batch norm, the clinic's own statistics": [clinic_accuracy(rebuild(bn, "batch"), idx, own_statistics=True)
                                                for idx in scanners.client_indices],
    "layer norm": [clinic_accuracy(rebuild(runs["layer"], "layer"), idx) for idx in scanners.client_indices],
}
for name, values in accuracy.items():
    print(f"{name:>40}: mean accuracy on the clinics' data {np.mean(values):.3f}")

# %%

fig, (ax_curve, ax_clinic) = plt.subplots(1, 2, figsize=(13, 4.4), constrained_layout=True,
                                          gridspec_kw={"width_ratios": [1, 1.2]})
for norm, label in (("batch", "batch norm"), ("layer", "layer norm"), (None, "no normalisation")):
    rounds, acc = zip(*runs[norm].history_.accuracies())
    ax_curve.plot(np.array(rounds) + 1, acc, label=label)
ax_curve.set_xlabel("round")
ax_curve.set_ylabel("test accuracy")
ax_curve.set_title("Test accuracy, one seed")
ax_curve.legend()
width = 0.27
for i, (name, values) in enumerate(accuracy.items()):
    ax_clinic.bar(np.arange(10) + (i - 1) * width, values, width, label=name)
ax_clinic.set_xticks(np.arange(10), [f"{o:+.1f}" for o in offsets])
ax_clinic.set_xlabel("clinic, by its scanner's brightness offset")
ax_clinic.set_ylabel("accuracy of the final model on the clinic's data")
ax_clinic.set_ylim(0, 1.15)
ax_clinic.legend(fontsize="small", ncol=2, loc="upper center")
ax_clinic.set_title("Batch norm evaluated with which statistics?")
fig.suptitle("digits, 10 clinics with their own brightness and contrast, 3 per round")
plt.show()

# %%
# Two constraints of batch norm are checked before training. A layer with
# ``momentum=None`` (a cumulative average) is refused, and ``BatchNorm1d`` cannot
# normalise a batch of one sample, so a ``batch_size`` that leaves some client a last
# minibatch of one is refused with what to change:

sizes = scanners.n_train_samples
batch_size = next(b for b in range(8, 64) if (sizes % b == 1).any())
try:
    fedselect.FederatedTrainer(model=DigitNet, model_params={"norm": "batch"}, batch_size=batch_size,
                               rounds=1).fit(scanners)
except ValueError as exc:
    print("ValueError:", exc)

# %%
# Regression, and a loss of your own
# ----------------------------------
# The loss is used everywhere a loss is computed: local training, the test loss, and
# the client losses that selectors see (``oracle.losses``, the feedback after a round).
# Loss-based selectors therefore rank clients by *your* loss. That matters.
#
# A regression federation (float targets, see the tutorial "Your own data"): 20 clients
# each hold 60 samples of a linear model y = x . w + noise, each with its own input
# shift. Clients 0 to 3 record their targets badly: heavy-tailed noise (Student t with 2
# degrees of freedom, scale 4) on top. The test set is clean.

rng = np.random.RandomState(0)
n_features, n_clients, n_per_client = 8, 20, 60
w_true = rng.normal(size=n_features)
noisy = np.arange(n_clients) < 4
pool_X, pool_y = [], []
for k in range(n_clients):
    Xk = rng.normal(size=(n_per_client, n_features)) + rng.normal(0, 0.5, n_features)
    yk = Xk @ w_true + rng.normal(0, 0.5, n_per_client)
    if noisy[k]:
        yk += 4 * rng.standard_t(2, n_per_client)
    pool_X.append(Xk)
    pool_y.append(yk)
X_test_r = rng.normal(size=(500, n_features))
y_test_r = X_test_r @ w_true + rng.normal(0, 0.5, 500)
regression = Federation(np.concatenate(pool_X).astype(np.float32), np.concatenate(pool_y).astype(np.float32),
                        np.split(np.arange(n_clients * n_per_client), n_clients), X_test_r.astype(np.float32),
                        y_test_r.astype(np.float32), name="linear, 4 of 20 clients with noisy targets")
print(regression.summary())

# %%
# ``loss="mse"`` is the mean squared error. A callable loss receives the model's
# outputs ``(m, n_outputs)`` and the ``m`` targets and returns ``m`` per-sample losses
# (reduction none; the engine averages per client). It runs inside the batched training
# step, so it must be differentiable and must not call ``.item()``. The Huber loss is
# quadratic for small errors and linear for large ones, so an outlier pulls on the model
# with a bounded force:


def huber(outputs, targets):
    return F.huber_loss(outputs.squeeze(-1), targets, reduction="none", delta=1.0)


def test_mse(trainer):
    """The test MSE of a trained linear model: one yardstick for runs trained with different losses."""
    linear = nn.Linear(n_features, 1)
    nn.utils.vector_to_parameters(torch.from_numpy(trainer.parameters_), linear.parameters())
    with torch.no_grad():
        predictions = linear(torch.from_numpy(regression.X_test)).squeeze(-1)
    return float(((predictions - torch.from_numpy(regression.y_test)) ** 2).mean())


reg_runs = {}
for selector in ("random", "power-of-choice"):
    for loss_name, loss in (("mse", "mse"), ("huber", huber)):
        reg_runs[selector, loss_name] = [
            fedselect.FederatedTrainer(selector=selector, model="logistic", loss=loss, clients_per_round=4,
                                       rounds=40, batch_size=16, lr=0.05, random_state=seed, n_threads=1
                                       ).fit(regression)
            for seed in range(3)
        ]
print("test_accuracy of a regression run:", reg_runs["random", "mse"][0].history_.rounds[-1].test_accuracy)
for (selector, loss_name), trainers in reg_runs.items():
    counts = np.sum([t.history_.selection_counts(n_clients) for t in trainers], axis=0)
    print(f"{selector:>15} + {loss_name:<5}: test MSE per seed {[round(test_mse(t), 3) for t in trainers]}; "
          f"{counts[noisy].sum() / counts.sum():.0%} of the trainings on the 4 noisy clients")

# %%
# Power-of-choice asks ``d`` random candidates for their loss and trains those with the
# largest. Under squared error the noisy clients always have the largest loss, so they
# are trained about twice as often as under random selection, and their outliers, with
# quadratic pull, drag the model away: the test MSE is worse than random's. With the
# Huber loss the noisy clients still have the largest losses and get the same share of
# the trainings, but their pull is bounded, and both schemes end near the noise floor
# (0.25, the variance of the clean noise). The history records each run's own test loss
# (for Huber runs, the Huber loss), so runs trained with different losses are compared
# here on one yardstick computed from ``parameters_``.

fig, (ax_loss, ax_bar) = plt.subplots(1, 2, figsize=(12, 4.2), constrained_layout=True)
for selector in ("random", "power-of-choice"):
    curves = np.array([[r.test_loss for r in t.history_.rounds] for t in reg_runs[selector, "mse"]])
    rounds = np.arange(1, curves.shape[1] + 1)
    line, = ax_loss.plot(rounds, curves.mean(0), label=f"{selector}, loss='mse'")
    ax_loss.fill_between(rounds, curves.min(0), curves.max(0), color=line.get_color(), alpha=0.2)
ax_loss.set_yscale("log")
ax_loss.set_xlabel("round")
ax_loss.set_ylabel("test MSE (recorded test_loss)")
ax_loss.set_title("Squared error: mean over 3 seeds, band min to max")
ax_loss.legend()
labels = [f"{selector}\n{loss_name}" for selector, loss_name in reg_runs]
ax_bar.bar(labels, [np.mean([test_mse(t) for t in ts]) for ts in reg_runs.values()],
           color=["tab:blue", "tab:cyan", "tab:orange", "tab:red"])
ax_bar.axhline(0.25, color="0.4", ls=":", label="noise floor")
ax_bar.set_ylabel("final test MSE, mean over 3 seeds")
ax_bar.set_title("Selector and training loss")
ax_bar.legend()
fig.suptitle("linear regression, 20 clients (4 with heavy-tailed target noise), 4 per round")
plt.show()

# %%
# Local momentum
# --------------
# ``momentum=m`` gives each chosen client SGD with heavy-ball momentum during its local
# steps, exactly as ``torch.optim.SGD(momentum=m, nesterov=...)``. The momentum buffer
# starts empty in every round (server-side momentum across rounds, as in FedAvgM, is not
# built in), so momentum only acts over a client's local steps: with a single step per
# round it changes nothing and with two it changes little, so we give each client 10
# local steps. With momentum m a
# steady gradient moves the weights lr / (1 - m) per step, so ``lr=0.01, momentum=0.9``
# takes steps comparable to plain SGD at ``lr=0.1``; keeping ``lr=0.1`` with momentum
# 0.9 steps ten times further.

momentum_runs = {}
for label, options in (("plain SGD, lr=0.1", dict(lr=0.1)),
                       ("momentum 0.9, lr=0.01", dict(lr=0.01, momentum=0.9)),
                       ("Nesterov 0.9, lr=0.01", dict(lr=0.01, momentum=0.9, nesterov=True)),
                       ("momentum 0.9, lr=0.1", dict(lr=0.1, momentum=0.9))):
    momentum_runs[label] = fedselect.FederatedTrainer(model=DigitNet, clients_per_round=4, rounds=25, local_steps=10,
                                                      batch_size=16, random_state=0, n_threads=1,
                                                      **options).fit(fed).history_
    h = momentum_runs[label]
    print(f"{label:>22}: rounds to 80 % {h.rounds_to_accuracy(0.8)}, final accuracy {h.final_accuracy():.3f}")

fig, ax = plt.subplots(figsize=(7, 4.2), constrained_layout=True)
for label, h in momentum_runs.items():
    rounds, acc = zip(*h.accuracies())
    ax.plot(np.array(rounds) + 1, acc, label=label)
ax.axhline(0.8, color="0.4", ls="--", lw=1, label="target 80 %")
ax.set_xlabel("round")
ax.set_ylabel("test accuracy")
ax.set_title("Local momentum, 10 local steps per round, one seed")
ax.legend()
plt.show()

# %%
# One seed is an anecdote; to decide, compare over seeds as in the gallery's paired
# example (``run_comparison`` takes ``momentum`` among the trainer's settings). What the
# curves do show is the rule of thumb: momentum multiplies the step, so lower the
# learning rate with it.
#
# Where next
# ----------
# * :doc:`plot_1_your_own_data`: building the federations these models train on.
# * :doc:`plot_3_your_own_scheme`: your own selection scheme, without packaging it.
