"""
Comparing schemes with the paired test
======================================

One run per scheme says little: on a heterogeneous federation the partition and the
model's starting point move the rounds to a target accuracy by several rounds, often
more than the schemes differ. :func:`fedselect.compare.run_comparison` runs every scheme
with every seed on the *same* federation, initial model and minibatch streams, so that
within one seed the schemes differ only in whom they choose. Comparing them seed by seed
(a paired comparison) then removes the variation they share.

This example compares four schemes on ``digits`` split so that every client holds a
single digit, reads the table, the curves, and the paired Wilcoxon test with Holm's
correction, and says what the test does and does not tell you.
"""

# %%
# Four schemes, eight seeds
# -------------------------
# 20 clients, each holding one shard of the label-sorted training data (one digit per
# client), 5 clients per round, one local epoch, a logistic-regression model so the 32
# runs take seconds. ``selectors`` maps a row label to a registered name and its
# parameters; for seed ``s`` the federation is built with ``random_state=s`` and every
# scheme trains with ``random_state=s``.
#
# * ``random``: 5 clients uniformly at random, the reference;
# * ``round-robin``: every client once per pass of 4 rounds, in a random order;
# * ``power-of-choice``: asks 10 random candidates for their loss (paid) and trains the
#   5 with the largest;
# * ``afl``: samples by a softmax of loss-based valuations (active federated learning).

import matplotlib.pyplot as plt
import numpy as np

from fedselect.compare import run_comparison
from fedselect.plotting import plot_accuracy

TARGET = 0.8
SEEDS = range(8)
comparison = run_comparison(
    {
        "random": ("random", {}),
        "round-robin": ("round-robin", {}),
        "power-of-choice": ("power-of-choice", {"d": 10}),
        "afl": ("afl", {}),
    },
    federation={"dataset": "digits", "partition": "shards", "n_clients": 20, "shards_per_client": 1},
    trainer={"model": "logistic", "clients_per_round": 5, "rounds": 30, "local_epochs": 1, "batch_size": 16,
             "lr": 0.1, "n_threads": 1},
    seeds=SEEDS,
    target=TARGET,
    progress=False,
)

# %%
# The table: mean and spread over seeds
# -------------------------------------
# ``to_markdown()`` is the table ``fedselect compare`` writes to ``table.md``; each
# header says what it averages over. "Rounds to 80%" is, per seed, the first round
# (counted from 1) whose test accuracy reached the target, then the mean ± standard
# deviation over seeds. The cost columns count what one run spent *until* the target.
# ``to_text()`` is the same table with short headers and a legend, as ``fedselect compare`` prints it.

print(comparison.to_markdown())

# %%
# The same rows as dictionaries, for your own tables, here the columns that matter
# most. Power-of-choice sent about twice as many models down as it trained clients:
# each of its candidates' loss queries needs the current model.

for row in comparison.rows():
    print(f"{row['scheme']:>16}: {row['rounds_to_target']:4.1f} ± {row['rounds_to_target_std']:.1f} rounds, "
          f"per run until then {row['models_down_to_target']:4.0f} models down, "
          f"{row['scalars_up_to_target']:4.0f} losses up, {row['trainings_to_target']:4.0f} local trainings")

# %%
# The curves
# ----------
# :func:`fedselect.plotting.plot_accuracy` draws the mean test accuracy over seeds with a
# band of ±1 standard deviation, and adds the setting the runs share to the title. The
# bands overlap for much of the run: read alone, they leave open whether round robin and
# power-of-choice really beat random, and they cannot say by how much on a given
# federation.

results = {label: [runs[s] for s in sorted(runs)] for label, runs in comparison.histories.items()}
fig, ax = plt.subplots(figsize=(9, 4.8), constrained_layout=True)
plot_accuracy(results, target=TARGET, ax=ax, title="Four schemes on clients holding one digit each")
plt.show()

# %%
# The paired test
# ---------------
# ``paired("random")`` takes, for every other scheme and every seed both have, the
# difference *scheme − random* in rounds to the target (negative: the scheme was
# faster). A run that never reached the target counts as its number of rounds + 1, a
# lower bound on what it would have needed.
#
# On those differences it runs the two-sided **Wilcoxon signed-rank test**: under the
# null hypothesis that the differences are symmetric around zero (the scheme is no
# better and no worse than random on this setting), every sign pattern of the ranked
# differences is equally likely, and ``p`` is the probability of a rank sum at least as
# far from its centre as the one observed. Zero differences are dropped. With 8 seeds
# the smallest possible p is 2 / 2⁸ ≈ 0.008 (all eight differences of one sign); with
# 5 seeds or fewer no result can reach p < 0.05, and the table then says so.
#
# Three schemes are compared with random here, so three chances to find a "significant"
# difference by luck. **Holm's correction** (:func:`fedselect.compare.holm`) controls the
# chance of *any* false finding among the three at α: the smallest p is multiplied by
# 3, the next by 2, the largest by 1 (kept non-decreasing). Use the Holm column when
# you claim a difference.

print(comparison.paired_markdown("random"))

# %%
# The same numbers as data, for your own reports:

rows = comparison.paired("random")
for row in rows:
    verdict = "faster than random" if row["mean"] < 0 else "slower than random"
    sure = "survives Holm at 0.05" if row["p_holm"] < 0.05 else "not significant after Holm at 0.05"
    print(f"{row['scheme']:>16}: {row['mean']:+.1f} rounds on average ({verdict} on "
          f"{row['slower'] if row['mean'] < 0 else row['faster']} of {len(row['seeds'])} seeds), "
          f"p = {row['p']:.3f}, Holm p = {row['p_holm']:.3f}: {sure}")

# %%
# Seed by seed
# ------------
# The differences the test looks at, one dot per seed. A scheme whose dots all lie on
# one side of zero is consistently faster or slower, however wide its band was in the
# curves above.

fig, ax = plt.subplots(figsize=(7, 3.2), constrained_layout=True)
for i, row in enumerate(rows):
    diffs = np.asarray(row["diffs"])
    jitter = np.linspace(-0.15, 0.15, diffs.size)
    ax.scatter(diffs, i + jitter, s=22, label=f"{row['scheme']} (Holm p = {row['p_holm']:.3f})")
    ax.plot([np.median(diffs)] * 2, [i - 0.3, i + 0.3], color="k", lw=1.5)
ax.axvline(0, color="0.4", ls="--", lw=1)
ax.set_yticks(range(len(rows)), [r["scheme"] for r in rows])
ax.set_xlabel("rounds to 80 %: scheme − random, same seed (negative: scheme faster)")
ax.set_title("Paired differences against random: one dot per seed, black bar the median")
ax.legend(fontsize="small", loc="best")
plt.show()

# %%
# What the test says, and what it does not
# ----------------------------------------
# A Holm-adjusted p below 0.05 says: on *this* setting (this data set, partition,
# model, learning rate, target and number of rounds), across the seeds, which vary the
# partition, the initial model and the minibatches, the scheme's rounds to the target
# differ from random's more consistently than chance would explain. It does not say:
#
# * **how large** the gain is or would be elsewhere: read the mean and median columns,
#   and run the setting you care about;
# * that it **generalises** to other data sets, models, targets or numbers of clients:
#   the seeds sample one setting, not settings. Here round robin does well because with
#   one digit per client, visiting every client once per four rounds covers every digit;
# * anything about **cost**: power-of-choice's gain is paid with extra loss queries
#   (models down and losses up in the table above);
# * that a scheme with a large p **equals** random: with 8 seeds only consistent
#   differences of a few rounds can be detected. Absence of evidence is not evidence of
#   absence; more seeds narrow it down.
#
# The same comparison runs from the command line, with the paired table written to
# ``paired.md``::
#
#     fedselect compare --selectors random round-robin power-of-choice:d=10 afl \
#         --dataset digits --partition shards --shards-per-client 1 --n-clients 20 \
#         --model logistic --clients-per-round 5 --rounds 30 --local-epochs 1 \
#         --batch-size 16 --lr 0.1 --aggregation data-size --target 0.8 \
#         --seeds 0 1 2 3 4 5 6 7 --paired random --out paired-example
