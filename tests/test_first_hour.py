"""First-hour frictions (issue 25, item 6): names a new user gets wrong, and where the classes live."""

import subprocess
import sys

import pytest

import fedselect


def test_a_misspelt_parameter_names_the_valid_ones_and_the_closest():
    expected = r"does not accept parameter 'D' \(did you mean 'd'\?\); its parameters: d, random_state"
    with pytest.raises(TypeError, match=expected):
        fedselect.get_selector("power-of-choice", D=10)


def test_a_misspelt_selector_gets_a_suggestion():
    expected = r"unknown selector 'powr-of-choice' \(did you mean 'power-of-choice'\?\); registered"
    with pytest.raises(KeyError, match=expected):
        fedselect.get_selector("powr-of-choice")


def test_valid_parameters_still_build():
    assert fedselect.get_selector("power-of-choice", d=10).d == 10


@pytest.mark.parametrize("name", fedselect.list_selectors())
def test_every_builtin_class_is_importable_from_fedselect_selectors(name):
    import fedselect.selectors as sel

    cls = type(fedselect.get_selector(name))
    if cls.__module__.startswith("fedselect.selectors."):
        assert getattr(sel, cls.__name__) is cls and cls.__name__ in sel.__all__


def test_importing_the_package_does_not_import_the_selector_modules():
    code = ("import sys, fedselect, fedselect.selectors; "
            "print(any(m.startswith('fedselect.selectors.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_the_selection_frequency_picture_has_whole_client_ids_on_its_axis():
    import matplotlib

    matplotlib.use("Agg")
    from fedselect.plotting import plot_selection_frequency

    fed = fedselect.make_federation("digits", partition="iid", n_clients=3, random_state=0)
    h = fedselect.FederatedTrainer(selector="random", clients_per_round=2, rounds=3, local_steps=1,
                                   random_state=0).fit(fed).history_
    ax = plot_selection_frequency({"random": [h]}, fed.n_clients)
    ax.figure.canvas.draw()
    ticks = [t for t in ax.get_xticks() if -0.5 <= t <= 2.5]
    assert ticks and all(float(t).is_integer() for t in ticks)
