"""
Writing a plugin
================

A selection scheme is a small class: a :class:`~fedselect.BaseSelector` subclass with
``_fit`` and ``_select`` (and optionally ``_update``). This example writes one, checks it
with the conformance suite, runs it beside random selection, shows what its questions
to the clients cost, and explains how to package it so that every fedselect tool finds
it by name.
"""

# %%
# The scheme: sample clients in proportion to their loss
# ------------------------------------------------------
# Clients whose loss on the global model is large have the most to learn. This scheme
# keeps the last loss it knows for every client and samples ``n`` clients without
# replacement with probability proportional to it. It learns losses in two ways:
#
# * **paid**: each round it asks ``probe`` random clients for their current loss through
#   the oracle, ``oracle.losses(ids)``. A real server would have to send each of them the
#   global model and receive a number back, so the simulator charges one model down and
#   one scalar up per client asked;
# * **with the round**: after a round, :class:`~fedselect.RoundFeedback` carries each
#   trained client's loss before its local training, sent with its update. The client
#   evaluates it on its own data first, so the runtime does that (and charges and times
#   it) only for a selector that declares ``needs = frozenset({"losses"})``; without it
#   ``feedback.losses`` is None.
#
# A client whose loss is still unknown counts as the largest known loss, so it is
# likely to be tried. A client that does not answer (in a real federation, or with the
# trainer's ``client_dropout``) answers NaN: the scheme keeps the loss it knew.
#
# The conventions are scikit-learn's: a keyword-only ``__init__`` that only stores its
# parameters, learned state in attributes ending in ``_`` created in ``_fit``, the
# random stream from ``random_state``. ``_parameter_constraints`` declares the allowed
# values, so ``fit`` rejects ``probe=-1`` with a message naming the class and the
# parameter. ``BaseSelector.fit`` sets ``n_clients_`` and ``weights_`` before calling
# ``_fit``.

from numbers import Integral
from typing import ClassVar

import matplotlib.pyplot as plt
import numpy as np
from sklearn.utils import check_random_state

import fedselect
from fedselect import BaseSelector, RoundFeedback, Selection
from fedselect.compare import run_comparison
from fedselect.plugins import register_plugin
from fedselect.selection import Interval
from fedselect.testing import check_selector


class LossProportionalSelector(BaseSelector):
    """Sample n clients without replacement with probability proportional to their last known loss.

    Parameters
    ----------
    probe : int, default=5
        Clients asked for their current loss each round (paid: one model down and one
        loss up each). 0 learns only from the free feedback of trained clients.
    random_state : None, int or numpy RandomState
        Seeds the probes and the draws.
    """

    needs = frozenset({"losses"})  # update() reads feedback.losses: the runtime computes them only when declared
    _parameter_constraints: ClassVar[dict] = {"probe": [Interval(Integral, 0, None, closed="left")]}

    def __init__(self, *, probe=5, random_state=None):
        self.probe = probe
        self.random_state = random_state

    def _fit(self, pool):
        self.rng_ = check_random_state(self.random_state)
        self.losses_ = np.full(self.n_clients_, np.nan)

    def _remember(self, ids, losses):
        losses = np.asarray(losses, dtype=float)
        answered = np.isfinite(losses)  # NaN: the client did not answer; keep what we knew
        self.losses_[np.asarray(ids)[answered]] = losses[answered]

    def _select(self, n, *, round, oracle):
        probe = min(self.probe, self.n_clients_)
        if probe:
            ids = self.rng_.choice(self.n_clients_, size=probe, replace=False)
            self._remember(ids, oracle.losses(ids))  # paid and recorded by the runtime
        known = np.isfinite(self.losses_)
        score = np.where(known, self.losses_, self.losses_[known].max() if known.any() else 1.0)
        score = np.clip(score, 1e-12, None)
        return Selection(self.rng_.choice(self.n_clients_, size=n, replace=False, p=score / score.sum()))

    def _update(self, feedback: RoundFeedback):
        self._remember(feedback.clients, feedback.losses)  # each reporter's loss before training (needs "losses")


# %%
# Check it with the conformance suite
# -----------------------------------
# :func:`fedselect.testing.check_selector` drives the selector through many rounds of a
# small synthetic federation (:class:`fedselect.testing.SyntheticOracle`, which answers
# the oracle's questions for real and records them) and checks the estimator
# conventions, valid selections for several federation sizes and ``n``, reproducibility
# under a fixed ``random_state``, that ``fit`` starts over, that neither ``select`` nor
# ``update`` mutates its inputs, and that clients that do not answer never break it. It
# raises an ``AssertionError`` naming the failed check. Put it in your tests.

check_selector(LossProportionalSelector(probe=3))
print("LossProportionalSelector passes every conformance check")

# %%
# What the checks catch: this variant forgets ``random_state`` and draws from a fresh,
# unseeded generator, so two runs with the same seed choose different clients. A
# comparison over seeds would then no longer be reproducible.


class UnseededLossProportionalSelector(LossProportionalSelector):
    def _fit(self, pool):
        super()._fit(pool)
        self.rng_ = np.random.default_rng()  # the bug: ignores self.random_state


try:
    check_selector(UnseededLossProportionalSelector(probe=3))
except AssertionError as exc:
    print(str(exc)[:300])

# %%
# Run it beside random selection
# ------------------------------
# :class:`~fedselect.FederatedTrainer` takes a selector instance as well as a registered
# name. Both runs use the same seed, hence the same federation, initial model and
# minibatches; only whom they choose differs. The model is the default small MLP.

fed = fedselect.make_federation("digits", partition="shards", n_clients=20, shards_per_client=2, random_state=0)
settings = dict(clients_per_round=5, rounds=40, local_epochs=1, batch_size=16, lr=0.1, random_state=0,
                n_threads=1)
histories = {
    "random": fedselect.FederatedTrainer(selector="random", **settings).fit(fed).history_,
    "loss-proportional (probe=5)": fedselect.FederatedTrainer(
        selector=LossProportionalSelector(probe=5), **settings).fit(fed).history_,
}

# %%
# What it was charged
# -------------------
# ``total_costs()`` sums the round records' :class:`~fedselect.ledger.Costs`. Random
# selection sends the model to the 5 clients it trains and receives 5 models and 5
# losses back each round. The new scheme also asks 5 probed clients per round for
# their loss: up to 5 more models down and 5 more losses up (fewer when a probed
# client is then chosen: it already holds the model, and its loss is not asked twice).

for label, history in histories.items():
    c = history.total_costs()
    print(f"{label:>28}: rounds to 80 %: {history.rounds_to_accuracy(0.8)}, "
          f"final accuracy {history.final_accuracy():.3f}")
    print(f"{'':>28}  models down {c.models_down}, models up {c.models_up}, losses up {c.scalars_up}, "
          f"local trainings {c.local_trainings}")

# %%
# Against rounds the scheme may look better; against what was sent down it pays for its
# questions. Drawing both keeps the comparison honest.

fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True, constrained_layout=True)
for label, history in histories.items():
    rounds, accuracy = zip(*history.accuracies())
    sent = np.cumsum([r.costs.models_down for r in history.rounds])
    axes[0].plot(np.array(rounds) + 1, accuracy, label=label)
    axes[1].plot(sent[list(rounds)], accuracy, label=label)
for ax in axes:
    ax.axhline(0.8, color="0.4", ls="--", lw=1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
axes[0].set_xlabel("round")
axes[0].set_ylabel("test accuracy")
axes[0].set_title("accuracy against rounds")
axes[1].set_xlabel("models sent down so far (trained and probed clients)")
axes[1].set_title("accuracy against communication")
fig.suptitle("digits, 20 clients with 2 shards each, 5 per round, one seed")
plt.show()

# %%
# Over seeds, with the paired test
# --------------------------------
# One seed is an anecdote. :func:`fedselect.compare.run_comparison` takes the selector
# itself, no registration needed: a registered name, an instance or the class (each
# run trains its own clone). Eight seeds, the faster logistic-regression model; the
# paired test is explained in the previous example.

comparison = run_comparison(
    {"random": "random", "loss-proportional": LossProportionalSelector(probe=5)},
    federation={"dataset": "digits", "partition": "shards", "n_clients": 20, "shards_per_client": 2},
    trainer={"model": "logistic", "clients_per_round": 5, "rounds": 30, "local_epochs": 1, "batch_size": 16,
             "lr": 0.1, "n_threads": 1},
    seeds=range(8), target=0.8, progress=False,
)
for row in comparison.rows():
    print(f"{row['scheme']:>17}: rounds to 80 %: {row['rounds_to_target']:4.1f} ± {row['rounds_to_target_std']:.1f}, "
          f"per run until then {row['models_down_to_target']:3.0f} models down, "
          f"{row['trainings_to_target']:3.0f} local trainings")
print()
print(comparison.paired_markdown("random"))

# %%
# The paired table says whether the new scheme reaches 80 % in fewer rounds than random,
# and the costs what it spent until then. In this run it is no faster, and it
# sends more models down: on this federation its probes do not pay for themselves. That
# is a common first result for a new scheme, and the reason to measure both rounds and
# costs before claiming anything.
#
# Use it by name: a plugin
# ------------------------
# To make the scheme appear by name in every tool (``fedselect.get_selector``,
# ``FederatedTrainer(selector="loss-proportional")``, ``fedselect compare --selectors
# loss-proportional``, ``fedselect list``), add a registration hook next to the class::
#
#     from fedselect import hookimpl
#
#     @hookimpl
#     def register_selectors(register):
#         register(LossProportionalSelector, name="loss-proportional")
#
# **Before packaging**, save the class and the hook as ``loss_proportional.py`` and
# load that file: ``fedselect compare --plugin loss_proportional.py --selectors random
# loss-proportional`` on the command line (``--plugin`` works on ``run``, ``compare``,
# ``reproduce`` and ``list``), or ``fedselect.plugins.load_plugin("loss_proportional.py")``
# in Python.
#
# **As a package**, put the same module in ``fedselect_lossprop/__init__.py`` and
# declare it as an entry point of the group ``fedselect``; this whole
# ``pyproject.toml`` is enough::
#
#     [build-system]
#     requires = ["setuptools>=68"]
#     build-backend = "setuptools.build_meta"
#
#     [project]
#     name = "fedselect-lossprop"
#     version = "0.1.0"
#     dependencies = ["fedselect"]
#
#     [project.entry-points.fedselect]
#     loss-proportional = "fedselect_lossprop"
#
# After ``pip install -e .`` in that package, fedselect loads the entry point the first
# time a registry is read, and ``fedselect list`` shows ``loss-proportional``. The
# README's "Writing a selector plugin" section builds such a package step by step (a
# test builds it from the README), and ``plugins/fedselect-divfl`` in the repository is
# a whole plugin package with its tests.
#
# In a script or notebook, :func:`fedselect.plugins.register_plugin` registers any
# object holding the hook, checked at once; here an instance of a small class:


class LossProportionalPlugin:
    @fedselect.hookimpl
    def register_selectors(self, register):
        register(LossProportionalSelector, name="loss-proportional")


register_plugin(LossProportionalPlugin(), name="loss-proportional (this example)")
print(fedselect.get_selector("loss-proportional", probe=8))
print("loss-proportional" in fedselect.list_selectors())
