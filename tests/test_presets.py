"""The built-in presets: what a calibrated preset may change, and that it runs as given."""

from __future__ import annotations

import numpy as np
import pytest

from fedselect.compare import check_plan
from fedselect.data.partition import PARTITIONS
from fedselect.presets import HCSFED_CALIBRATION, get_preset, list_presets

# What every scheme of a comparison shares and no scheme owns: a calibration may change these and nothing else.
SHARED_FEDERATION = {"partition", "alpha", "min_samples", "shards_per_client"}
SHARED_TRAINER = {"lr", "local_steps", "local_epochs", "batch_size", "rounds"}
QS = ("0.1", "0.3", "0.5")


def _changed(a: dict, b: dict) -> set[str]:
    return {k for k in a.keys() | b.keys() if a.get(k, "absent") != b.get(k, "absent")}


@pytest.mark.parametrize("q", QS)
def test_calibrated_hcsfed_changes_only_the_shared_setting(q):
    base = get_preset(f"hcsfed-fmnist-q{q}")
    cal = get_preset(f"hcsfed-fmnist-q{q}-calibrated")
    assert cal.name == f"{base.name}-calibrated" and cal.name in list_presets()
    # The same rows, each the same selector with the same parameters (no scheme is tuned) ...
    assert cal.selectors == base.selectors
    assert list(cal.selectors) == list(base.selectors)  # the same row order in the tables
    # ... over the same seeds, to the same target, beside the same paper figures.
    assert (cal.seeds, cal.target, cal.paper) == (base.seeds, base.target, base.paper)
    # Only the shared setting changes, and exactly what the calibration says.
    fed_changed = _changed(cal.federation, base.federation)
    tr_changed = _changed(cal.trainer, base.trainer)
    assert fed_changed <= SHARED_FEDERATION and tr_changed <= SHARED_TRAINER
    assert fed_changed == set(HCSFED_CALIBRATION["federation"])
    assert tr_changed == set(HCSFED_CALIBRATION["trainer"])
    for key, value in {**HCSFED_CALIBRATION["federation"], **HCSFED_CALIBRATION["trainer"]}.items():
        assert {**cal.federation, **cal.trainer}[key] == value
    # The comparison itself is the paper's: same data, model, clients per round, aggregation and stopping rule.
    assert cal.trainer["clients_per_round"] == round(100 * float(q)) == base.trainer["clients_per_round"]
    assert cal.trainer["stop_at_target"] and cal.trainer["target_accuracy"] == 0.8
    # Room beyond the paper's 200 rounds, where its Random row stops ("200+").
    assert cal.trainer["rounds"] > 200


@pytest.mark.parametrize("q", QS)
def test_calibrated_hcsfed_preset_validates_and_its_partition_exists_for_every_seed(q, tmp_path):
    cal = get_preset(f"hcsfed-fmnist-q{q}-calibrated")
    built = check_plan(cal.selectors, trainer=cal.trainer, seeds=cal.seeds, out_dir=tmp_path,
                       federation=cal.federation)
    assert list(built) == list(cal.selectors)
    # The partition depends on the labels only through the class counts: FMNIST's training split has 6,000
    # images of each of its 10 classes, so these labels give the clients' sizes the real run gets.
    y = np.repeat(np.arange(10), 6000)
    fed = dict(cal.federation)
    scheme = PARTITIONS[fed.pop("partition")]
    n_clients = fed.pop("n_clients")
    fed.pop("dataset")
    for seed in cal.seeds:
        parts = scheme(y, n_clients, random_state=np.random.RandomState(seed), **fed)
        sizes = np.array([p.size for p in parts])
        assert sizes.sum() == y.size and sizes.min() >= cal.federation["min_samples"]
        # the label skew the calibration is about: most clients hold (almost) one label
        top = np.array([np.bincount(y[p], minlength=10).max() / p.size for p in parts])
        assert np.median(top) > 0.95
