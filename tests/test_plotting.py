"""Comparison figures and tables say what they show (setting, what bands and cells average over), cut no label."""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from fedselect.compare import run_comparison
from fedselect.plotting import (
    describe_setting,
    figure_size,
    plot_accuracy,
    plot_communication,
    plot_selection_frequency,
)

LONG = "random(replace=True), a label long enough to be cut off by a fixed-size figure"


@pytest.fixture(scope="module")
def comparison(tmp_path_factory):
    return run_comparison(
        {"random": ("random", {}), LONG: ("random", {"replace": True})},
        federation={"dataset": "digits", "partition": "shards", "shards_per_client": 2, "n_clients": 8},
        trainer={"model": "logistic", "clients_per_round": 2, "rounds": 3, "local_steps": 2},
        seeds=(0, 1), target=0.2, out_dir=tmp_path_factory.mktemp("cmp"), progress=False,
    )


def _results(comparison):
    return {k: [v[s] for s in sorted(v)] for k, v in comparison.histories.items()}


def test_the_setting_is_described_from_the_histories(comparison):
    assert describe_setting(_results(comparison)) == (
        "digits, shards (shards_per_client=2), N = 8, C = 2, logistic, seeds 0, 1 (2 per scheme)")
    assert describe_setting({}) == ""


def test_a_setting_the_runs_do_not_share_is_not_taken_from_the_first_run(comparison):
    import copy

    results = _results(comparison)
    other = copy.deepcopy(results["random"][1])
    other.config["trainer"]["clients_per_round"] = 5
    text = describe_setting({"random": [results["random"][0], other]})
    assert "C = 2 or C = 5" in text and "digits, shards (shards_per_client=2), N = 8" in text


def _inside(fig, artists):
    """Every text drawn lies inside the figure (a label partly outside is cut off in the saved file)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    width, height = fig.bbox.width, fig.bbox.height
    drawn = fig.get_tightbbox(renderer)  # in inches: everything drawn, ticks outside the limits excluded
    w, h = fig.get_size_inches()
    assert drawn.x0 >= -0.01 and drawn.y0 >= -0.01 and drawn.x1 <= w + 0.01 and drawn.y1 <= h + 0.01, (drawn, w, h)
    for artist in artists:
        if not artist.get_text():
            continue
        box = artist.get_window_extent(renderer)
        assert box.x0 >= -1 and box.y0 >= -1 and box.x1 <= width + 1 and box.y1 <= height + 1, (
            f"{artist.get_text()!r} at {box} is outside the {width:.0f} x {height:.0f} figure")


@pytest.mark.parametrize("kind", ["accuracy", "selection_frequency", "communication"])
def test_each_figure_has_the_setting_in_its_title_and_cuts_no_label(comparison, kind):
    res = _results(comparison)
    fig, ax = plt.subplots(figsize=figure_size(kind, list(res), 8), constrained_layout=True)
    try:
        if kind == "accuracy":
            plot_accuracy(res, target=0.2, ax=ax, title="my comparison")
        elif kind == "selection_frequency":
            plot_selection_frequency(res, 8, ax=ax, title="my comparison")
        else:
            plot_communication(res, 0.2, ax=ax, title="my comparison")
        title = ax.get_title()
        assert title.startswith("my comparison\n") and "N = 8, C = 2" in title and "seeds 0, 1" in title
        texts = [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        if kind != "accuracy":  # one tick per scheme, all within the limits
            texts += ax.get_yticklabels()
        if kind == "accuracy":
            legend = ax.get_legend()
            # The band is the mean +- one standard deviation over seeds; the legend says exactly that.
            assert legend.get_title().get_text() == "line: mean over the n seeds\nband: ± 1 std over them"
            texts += [legend.get_title(), *legend.get_texts()]
            assert any(LONG in t.get_text() for t in legend.get_texts())
        elif kind == "communication":
            assert "error bar: ± 1 std" in ax.get_xlabel()
        else:
            assert "mean over seeds" in fig.axes[-1].get_ylabel()  # the colour bar
        assert any(t.get_text() == LONG for t in ax.get_yticklabels()) or kind == "accuracy"
        _inside(fig, texts)
    finally:
        plt.close(fig)


def test_one_seed_draws_no_band_and_says_so(comparison):
    res = {k: v[:1] for k, v in _results(comparison).items()}
    ax = plot_accuracy(res, target=0.2)
    try:
        assert ax.get_legend().get_title().get_text() == "one seed: no band"
        assert not ax.collections  # no fill_between
    finally:
        plt.close(ax.figure)


def test_table_headers_say_what_each_column_averages_over(comparison):
    lines = comparison.to_markdown().splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    assert head[:5] == ["scheme", "rounds to 20%, mean ± std over seeds", "seeds reaching 20%",
                        "final acc, mean over seeds", "best acc, mean over seeds"]
    costs = head[5:9]
    assert [c.split(" to 20%")[0] for c in costs] == [
        "Mfloats communicated", "models down", "losses up", "local trainings"]
    assert all(c.endswith("to 20% per run, mean over seeds reaching it") for c in costs), costs
    assert head[9] == "seconds per run, mean over seeds"
    # ... and the cells are those means.
    row = dict(zip(head, (c.strip() for c in lines[2].strip("|").split("|"))))
    runs = comparison.histories[row["scheme"]].values()
    reaching = [h.costs_to_accuracy(0.2) for h in runs if h.rounds_to_accuracy(0.2) is not None]
    assert reaching, "the fixture's target is meant to be reached"
    assert float(row[costs[1]]) == pytest.approx(sum(c.models_down for c in reaching) / len(reaching), abs=0.5)
    assert row["seeds reaching 20%"] == f"{len(reaching)}/{len(runs)}"
