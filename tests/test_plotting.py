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
        seeds=(0, 1),
        target=0.2,
        out_dir=tmp_path_factory.mktemp("cmp"),
        progress=False,
    )


def _results(comparison):
    return {k: [v[s] for s in sorted(v)] for k, v in comparison.histories.items()}


def test_the_setting_is_described_from_the_histories(comparison):
    assert describe_setting(_results(comparison)) == (
        "digits, shards (shards_per_client=2), N = 8, C = 2, logistic, seeds 0, 1 (2 per scheme)"
    )
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
            f"{artist.get_text()!r} at {box} is outside the {width:.0f} x {height:.0f} figure"
        )


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
            assert legend.get_title().get_text() == (
                "line: mean over the n seeds, each carried\nat its last value after its run ended\n"
                "band: ± 1 std over them"
            )
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
        assert ax.get_legend().get_title().get_text().startswith("one seed: no band")
        assert not ax.collections  # no fill_between
    finally:
        plt.close(ax.figure)


def test_table_headers_say_what_each_column_averages_over(comparison):
    lines = comparison.to_markdown().splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    assert head[:5] == [
        "scheme",
        "rounds to 20%, mean ± std over seeds",
        "seeds reaching 20%",
        "final acc, mean over seeds",
        "best acc, mean over seeds",
    ]
    costs = head[5:9]
    assert [c.split(" to 20%")[0] for c in costs] == [
        "Mfloats communicated",
        "models down",
        "losses up",
        "local trainings",
    ]
    assert all(c.endswith("to 20% per run, mean over seeds reaching it") for c in costs), costs
    assert head[9] == "seconds per run, mean over seeds"
    # ... and the cells are those means.
    row = dict(zip(head, (c.strip() for c in lines[2].strip("|").split("|"))))
    runs = comparison.histories[row["scheme"]].values()
    reaching = [h.costs_to_accuracy(0.2) for h in runs if h.rounds_to_accuracy(0.2) is not None]
    assert reaching, "the fixture's target is meant to be reached"
    assert float(row[costs[1]]) == pytest.approx(sum(c.models_down for c in reaching) / len(reaching), abs=0.5)
    assert row["seeds reaching 20%"] == f"{len(reaching)}/{len(runs)}"


def _markers(ax, marker):
    """(x values, y values, face colour, edge colour) of every drawn line with that marker and data."""
    return [
        (list(line.get_xdata()), list(line.get_ydata()), line.get_markerfacecolor(), line.get_markeredgecolor())
        for line in ax.lines
        if line.get_marker() == marker and len(line.get_xdata())
    ]


def test_the_target_line_marks_each_seeds_first_crossing_and_the_tables_mean(comparison):
    res = _results(comparison)
    ax = plot_accuracy(res, target=0.2)
    try:
        colours = {
            line.get_label().split(" (n=")[0]: line.get_color() for line in ax.lines if "(n=" in line.get_label()
        }
        rows = {r["scheme"]: r for r in comparison.rows()}
        ticks, diamonds = _markers(ax, "|"), _markers(ax, "D")
        assert len(ticks) == len(diamonds) == len(res) == 2
        for label, hs in res.items():
            firsts = [h.rounds_to_accuracy(0.2) for h in hs]
            assert None not in firsts and firsts == rows[label]["rounds_to_target_each"]
            mine = [(x, y) for x, y, _, edge in ticks if matplotlib.colors.same_color(edge, colours[label])]
            assert mine == [(firsts, [0.2] * len(firsts))]  # one tick per seed, on the target line
            mine = [d for d in diamonds if matplotlib.colors.same_color(d[2], colours[label])]
            assert len(mine) == 1
            (x, y, _, edge) = mine[0]
            assert x == [pytest.approx(sum(firsts) / len(firsts))] and y == [0.2]  # the table's rounds to target
            assert matplotlib.colors.same_color(edge, "black")  # filled: every seed reached it
        texts = [t.get_text() for t in ax.get_legend().get_texts()]
        assert "each seed's first round at the target" in texts and "their mean: the table's rounds to target" in texts
        assert not any(t.startswith("hollow") for t in texts)
    finally:
        plt.close(ax.figure)


def test_a_scheme_where_a_seed_missed_the_target_gets_a_hollow_diamond(comparison):
    import copy

    res = _results(comparison)
    label = next(iter(res))
    missed = copy.deepcopy(res[label][1])
    for r in missed.rounds:
        r.test_accuracy = 0.0 if r.test_accuracy is not None else None
    res[label] = [res[label][0], missed]
    ax = plot_accuracy(res, target=0.2)
    try:
        colour = next(line.get_color() for line in ax.lines if line.get_label().startswith(f"{label} (n="))
        mine = [d for d in _markers(ax, "D") if matplotlib.colors.same_color(d[3], colour)]
        assert len(mine) == 1
        x, y, face, _ = mine[0]
        assert x == [res[label][0].rounds_to_accuracy(0.2)] and y == [0.2]  # the mean of the seed that reached it
        assert matplotlib.colors.same_color(face, "white")
        assert any(t.get_text().startswith("hollow: not every seed reached it") for t in ax.get_legend().get_texts())
    finally:
        plt.close(ax.figure)


def test_no_target_no_marks_and_a_target_nobody_reached_only_the_line(comparison):
    res = _results(comparison)
    for target in (None, 1.01):
        ax = plot_accuracy(res, target=target)
        try:
            assert not _markers(ax, "|") and not _markers(ax, "D")
            texts = [t.get_text() for t in ax.get_legend().get_texts()]
            assert not any("first round" in t for t in texts)
            assert any(t.startswith("target") for t in texts) == (target is not None)
        finally:
            plt.close(ax.figure)


def test_the_diamond_is_the_mean_of_the_first_crossings_not_the_median_nor_where_the_mean_curve_crosses(comparison):
    import copy

    base = _results(comparison)["random"][0]
    runs = []
    for accs in ([0.9, 0.9, 0.9], [0.9, 0.9, 0.9], [0.0, 0.0, 0.9]):  # first at the target: rounds 1, 1 and 3
        h = copy.deepcopy(base)
        for r, a in zip(h.rounds, accs, strict=True):
            r.test_accuracy = a
        runs.append(h)
    ax = plot_accuracy({"made up": runs}, target=0.8)
    try:
        (diamond,) = _markers(ax, "D")
        # mean 5/3; the median would say 1 and the mean curve (0.6, 0.6, 0.9) meets 0.8 at round 3
        assert diamond[0] == [pytest.approx(5 / 3)]
        (tick,) = _markers(ax, "|")
        assert tick[0] == [1, 1, 3]
    finally:
        plt.close(ax.figure)


@pytest.mark.parametrize("kind", ["accuracy", "selection_frequency", "communication"])
def test_a_long_title_is_wrapped_to_the_axes_and_stays_inside_the_figure(comparison, kind):
    res = {"random": _results(comparison)["random"]}  # short labels: the axes keep most of the figure's width
    title = "A title as long as a sentence that says what the comparison is about and why it was run, " * 2
    fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)  # a user's own figure, saved without "tight"
    try:
        if kind == "accuracy":
            plot_accuracy(res, target=0.2, ax=ax, title=title)
        elif kind == "selection_frequency":
            plot_selection_frequency(res, 8, ax=ax, title=title)
        else:
            plot_communication(res, 0.2, ax=ax, title=title)
        assert ax.get_title().count("\n") >= 3  # the title on several lines, then the setting
        assert " ".join(ax.get_title().split()).startswith(" ".join(title.split()))  # nothing of it lost
        fig.canvas.draw()
        box = ax.title.get_window_extent(fig.canvas.get_renderer())
        assert box.x0 >= 0 and box.x1 <= fig.bbox.width, (box, fig.bbox.width)
    finally:
        plt.close(fig)


def _clocked(accuracies, times):
    from fedselect.simulation.history import History, RoundRecord

    return History(
        [
            RoundRecord(round=t, clients=[0], test_accuracy=a, sim_time=None if times is None else float(times[t]))
            for t, a in enumerate(accuracies)
        ],
        model_size=1,
    )


def test_accuracy_against_simulated_time_steps_and_carries_each_seed_past_its_end():
    runs = {
        "timed": [_clocked([0.1, 0.5, 0.9], [10, 20, 30]), _clocked([0.2, 0.6, 0.8], [15, 25, 35])],
        "flower": [_clocked([0.3, 0.9], None)],  # measured, not simulated: no curve on this axis
    }
    ax = plot_accuracy(runs, target=0.8, x="time")
    try:
        (line,) = [ln for ln in ax.lines if ln.get_label().startswith("timed (n=2")]
        # by hand: on 15, 20, 25, 30, 35 s seed 0 holds 0.1, 0.5, 0.5, 0.9, 0.9 (its last value, carried past its end
        # at 30 s) and seed 1 0.2, 0.2, 0.6, 0.6, 0.8: the curve runs to the last seed's end, not the first's
        assert list(line.get_xdata()) == [15, 20, 25, 30, 35]
        assert list(line.get_ydata()) == pytest.approx([0.15, 0.35, 0.55, 0.75, 0.85])
        assert line.get_drawstyle() == "steps-post"  # the model the server holds until the next evaluation
        (tick,) = _markers(ax, "|")
        assert tick[0] == [30.0, 35.0]  # each seed's time to the target
        (diamond,) = _markers(ax, "D")
        assert diamond[0] == [pytest.approx(32.5)] and matplotlib.colors.same_color(diamond[3], "black")
        texts = [t.get_text() for t in ax.get_legend().get_texts()]
        assert "flower (n=1; no simulated clock)" in texts
        assert "their mean: the table's time to target" in texts
        assert ax.get_xlabel() == "simulated time (s)"
    finally:
        plt.close(ax.figure)
    with pytest.raises(ValueError, match="x='seconds'"):
        plot_accuracy(runs, x="seconds")


def test_the_setting_names_the_devices_the_runs_had():
    h = _clocked([0.5], [1.0])
    h.config = {
        "federation": {
            "dataset": "digits",
            "partition": "iid",
            "n_clients": 6,
            "profiles": "mobile",
            "profiles_fingerprint": "abc",
        }
    }
    assert describe_setting({"x": [h]}) == "digits, iid, N = 6, devices mobile"
