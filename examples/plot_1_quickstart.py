"""
Quickstart: random selection vs. power-of-choice
================================================

Build a heterogeneous federation from scikit-learn's ``digits`` data set, train it with
FedAvg under two client-selection schemes, and compare how fast each reaches 80 % test
accuracy and what each paid for it.

Power-of-choice (Cho, Wang and Joshi) draws ``d`` candidate clients, asks each of them
for its current loss, and trains the ``n`` with the largest loss. Asking is not free: each
candidate receives the global model and sends a loss back. fedselect records those costs,
so the comparison is honest.
"""

# %%
# A non-IID federation
# --------------------
# 20 clients, each holding two "shards" of the label-sorted training data, so most
# clients see only two digits.

import matplotlib.pyplot as plt

import fedselect

fed = fedselect.make_federation("digits", partition="shards", n_clients=20, shards_per_client=2, random_state=0)
print(fed)

# %%
# Train with two selectors
# ------------------------
# Same model (a small MLP), same seed, same data order: only the selection differs. Five
# clients train in each round, two local epochs each, for 30 rounds. ``selector`` takes a
# registered name (see ``fedselect.list_selectors()``) or a selector instance such as
# ``fedselect.get_selector("power-of-choice", d=10)``. A model this small trains fastest
# on one thread: ``n_threads=1`` avoids thread contention on a busy machine.

TARGET = 0.8
histories = {}
for name in ("random", "power-of-choice"):
    trainer = fedselect.FederatedTrainer(
        selector=name,
        clients_per_round=5,
        rounds=30,
        local_epochs=2,
        batch_size=16,
        optimizer=fedselect.LocalSGD(lr=0.1),
        random_state=0,
        n_threads=1,
    )
    histories[name] = trainer.fit(fed).history_

# %%
# Accuracy against rounds
# -----------------------

fig, ax = plt.subplots(figsize=(6, 4))
for name, history in histories.items():
    rounds, accuracies = zip(*history.accuracies())
    ax.plot([t + 1 for t in rounds], accuracies, label=name)
ax.axhline(TARGET, color="grey", linestyle=":", linewidth=1)
ax.set_xlabel("round")
ax.set_ylabel("test accuracy")
ax.set_title("digits, 20 clients, 2 shards each")
ax.legend()
fig.tight_layout()
plt.show()

# %%
# Rounds to 80 % and what they cost
# ---------------------------------
# ``rounds_to_accuracy`` counts rounds (t + 1 of the first round at the target) or
# returns None if the target was never reached. ``total_costs`` sums every model sent
# down and up, every loss reported and all local work, oracle queries included: the
# extra ``models_down`` and ``scalars_up`` of power-of-choice are its candidates'
# loss queries.

for name, history in histories.items():
    print(f"{name}: rounds to {TARGET:.0%}: {history.rounds_to_accuracy(TARGET)}, "
          f"final accuracy: {history.final_accuracy():.3f}")
    print(f"    {history.total_costs()}")

# %%
# One seed is an anecdote
# -----------------------
# Both runs used one seed: one partition, one initial model, one stream of minibatches.
# Another seed can reverse a difference of a few rounds. Before concluding that one
# scheme is faster, run several seeds and compare them seed by seed, as the next
# example does with :func:`fedselect.compare.run_comparison` and a paired test.
