"""Over-commitment is the round's: every scheme of a comparison gets the same one (issue 33 item 3)."""

from __future__ import annotations

import pytest

from fedselect import FederatedTrainer, make_federation
from fedselect.experiments.plan import equalize_overcommit, own_overcommit
from fedselect.experiments.run import run_comparison
from fedselect.selectors import OortSelector

CLOCKED = {"clock": True, "clients_per_round": 5}


def test_a_scheme_that_over_commits_by_itself_moves_it_to_the_round_for_every_scheme():
    table, trainer, note = equalize_overcommit(["random", "oort"], CLOCKED)
    assert trainer["straggler_policy"] == "overselect" and trainer["overselect"] == pytest.approx(1.1)
    assert own_overcommit(table["oort"].build()) == 1.0
    assert own_overcommit(table["random"].build()) == 1.0
    assert "oort" in note and "overselect=1.1" in note
    # an instance keeps its other parameters
    table, _, _ = equalize_overcommit({"o": OortSelector(variant="fedscale", pacer_step=7)}, CLOCKED)
    built = table["o"].build()
    assert (built.variant, built.pacer_step, built.overcommit) == ("fedscale", 7, 1.0)


def test_the_rounds_own_overselect_wins_and_nothing_over_commits_twice():
    table, trainer, note = equalize_overcommit(
        ["random", ("oort", {"variant": "fedscale"})], {**CLOCKED, "straggler_policy": "overselect", "overselect": 1.5}
    )
    assert trainer["overselect"] == 1.5
    assert own_overcommit(table["oort(variant=fedscale)"].build()) == 1.0
    assert note is not None


def test_as_set_and_nothing_to_equalise_leave_everything_as_given():
    table, trainer, note = equalize_overcommit(["random", "oort"], CLOCKED, mode="as-set")
    assert note is None and trainer == CLOCKED and own_overcommit(table["oort"].build()) == pytest.approx(1.1)
    table, trainer, note = equalize_overcommit(["random", "power-of-choice"], CLOCKED)
    assert note is None and trainer == CLOCKED


@pytest.mark.parametrize(
    ("selectors", "trainer", "message"),
    [
        (["oort", ("oort", {"variant": "fedscale"})], CLOCKED, "different factors"),
        (["random", "oort"], {"clock": False}, "needs a clock"),
        (["random", "oort"], CLOCKED | {"overselect": 1.2}, None),  # overselect alone is not a policy
    ],
)
def test_refusals(selectors, trainer, message):
    if message is None:
        _, out, _ = equalize_overcommit(selectors, trainer)
        assert out["overselect"] == pytest.approx(1.1)  # the schemes' factor, not a stray overselect
        return
    with pytest.raises(ValueError, match=message):
        equalize_overcommit(selectors, trainer)
    with pytest.raises(ValueError, match="overcommit='bogus'"):
        equalize_overcommit(selectors, trainer, mode="bogus")


def test_the_trainer_refuses_to_over_commit_twice():
    fed = make_federation("digits", n_clients=10, random_state=0)
    trainer = FederatedTrainer(
        selector="oort", clients_per_round=3, rounds=1, clock=True, straggler_policy="overselect", random_state=0
    )
    with pytest.raises(ValueError, match="over-commit twice"):
        trainer.fit(fed)


def test_a_comparison_asks_every_scheme_for_the_same_number_of_clients(tmp_path):
    # K = 5 at 1.1: the round asks ceil(5.5) = 6 of every scheme and keeps the first 5 to finish; before, Oort
    # asked floor(5.5) = 5 by itself and random 5, so neither over-committed here, and at K = 10 only Oort did.
    fed = {"dataset": "digits", "n_clients": 12, "profiles": "mobile"}
    comp = run_comparison(
        ["random", "oort"],
        federation=fed,
        trainer={"clients_per_round": 5, "rounds": 3, "stop_at_target": False},
        seeds=[0],
        progress=False,
        log=lambda msg: None,
    )
    for label in ("random", "oort"):
        history = comp.histories[label][0]
        assert all(len(r.clients) == 6 for r in history.rounds), label
        assert history.config["trainer"]["straggler_policy"] == "overselect"
