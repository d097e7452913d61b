"""A Flower run's records files into the comparison tools (issue 33, item 6): the same table, pictures and paired
statistics as ``fedselect compare``, and a file that cannot be read is an error naming it, not Nones."""

import json
import shutil
import warnings

import pytest

from fedselect.compare import Comparison, FlowerRecordsError, load_flower_records, read_flower_records
from fedselect.experiments.flower_records import write_report
from fedselect.flower import FederationClients, FlowerRoundWarning, LocalGrid, SelectorStrategy
from fedselect.simulation import History

from .conftest import TRAIN

SCHEMES, SEEDS, ROUNDS = ("random", "round-robin"), (0, 1), 3


def _run(fed, selector, seed, path, *, evaluate=True):
    clients = FederationClients(fed, random_state=seed, pooled_losses=True, **TRAIN)
    grid = LocalGrid(clients.client_app(), fed.n_clients, seed=11)
    strategy = SelectorStrategy(
        selector, clients_per_round=3, n_clients=fed.n_clients, aggregation="data-size", random_state=seed
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FlowerRoundWarning)
        strategy.start(
            grid,
            clients.initial_arrays(),
            num_rounds=ROUNDS,
            evaluate_fn=clients.evaluate_fn() if evaluate else None,
            records_path=path,
        )
    return strategy


@pytest.fixture(scope="module")
def records(fed8, tmp_path_factory):
    """A folder of four real records files (two schemes x two seeds) and the strategies that wrote them."""
    folder = tmp_path_factory.mktemp("records")
    strategies = {
        (name, seed): _run(fed8, name, seed, folder / f"{name}__seed{seed}.jsonl") for name in SCHEMES for seed in SEEDS
    }
    return folder, strategies


def test_a_records_file_reads_back_the_run_with_its_accuracies(records):
    folder, strategies = records
    strategy = strategies[("random", 0)]
    h = read_flower_records(folder / "random__seed0.jsonl", model_size=strategy.history_.model_size)
    assert [a for _, a in h.accuracies()] == [r.evaluation["test-accuracy"] for r in strategy.rounds_]
    assert len(h.accuracies()) == ROUNDS and all(a is not None for _, a in h.accuracies())
    assert h == strategy.history_  # the rounds the strategy itself hands to a Comparison
    # History.from_dict on the lines no longer gives every accuracy as None
    lines = [json.loads(line) for line in (folder / "random__seed0.jsonl").read_text().splitlines()]
    assert History.from_dict({"rounds": lines}).accuracies() == h.accuracies()


def test_a_folder_of_records_gives_the_table_pictures_and_paired_statistics_of_a_comparison(records, tmp_path):
    folder, strategies = records
    comp = load_flower_records(folder, 0.5, model_size=strategies[("random", 0)].history_.model_size)
    assert sorted(comp.histories) == sorted(SCHEMES) and all(sorted(r) == list(SEEDS) for r in comp.histories.values())
    direct = Comparison(
        {name: {seed: strategies[(name, seed)].history_ for seed in SEEDS} for name in sorted(SCHEMES)}, 0.5, 8
    )
    assert comp.rows() == direct.rows()
    assert repr(comp.paired("random")) == repr(direct.paired("random"))  # NaN p-values: compare the text
    assert comp.paired_report("random") == direct.paired_report("random")
    files = {p.name for p in write_report(comp, tmp_path)}
    assert {"table.md", "summary.json", "results.csv", "paired.md", "accuracy.png", "communication.png"} <= files
    assert "selection_frequency.png" in files
    assert "round-robin" in (tmp_path / "paired.md").read_text()
    assert all((tmp_path / f).stat().st_size > 0 for f in files)


def test_one_file_takes_its_label_and_seed_from_its_name_or_from_the_caller(records, tmp_path):
    folder, _ = records
    comp = load_flower_records(folder / "round-robin__seed1.jsonl", 0.5)
    assert list(comp.histories) == ["round-robin"] and list(comp.histories["round-robin"]) == [1]
    plain = tmp_path / "my-run.jsonl"
    shutil.copy(folder / "random__seed0.jsonl", plain)
    assert list(load_flower_records(plain, 0.5).histories) == ["my-run"]
    comp = load_flower_records(plain, 0.5, label="oort", seed=7)
    assert list(comp.histories) == ["oort"] and list(comp.histories["oort"]) == [7]
    comp = load_flower_records({"a": {3: plain}}, 0.5, n_clients=20)
    assert comp.n_clients == 20 and list(comp.histories["a"]) == [3]


def test_records_without_a_centralised_accuracy_are_an_error_naming_the_file(fed8, tmp_path):
    path = tmp_path / "random__seed0.jsonl"
    _run(fed8, "random", 0, path, evaluate=False)
    with pytest.raises(FlowerRecordsError, match=rf"{path}: no round holds a test accuracy.*evaluate_fn"):
        load_flower_records(tmp_path, 0.5)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda lines: lines + lines[:1], r"line 4: round 0 where round 3 was due.*appended"),
        (lambda lines: [json.dumps({"rounds": []})], r"line 1: not a round of SelectorStrategy's records"),
        (lambda lines: ["{not json"], r"line 1: not JSON"),
        (lambda lines: [], r"holds no round"),
        (
            lambda lines: [line.replace('"test-accuracy": ', '"test-accuracy": 7') for line in lines],
            r"line 1: the test accuracy 7.* is not a number in \[0, 1\]",
        ),
        (
            lambda lines: [line.replace('"clients": [', '"clients": [-5, ', 1) for line in lines],
            r"names clients outside",
        ),
    ],
)
def test_a_records_file_that_cannot_be_read_is_an_error_naming_it(records, tmp_path, edit, match):
    folder, _ = records
    lines = (folder / "random__seed0.jsonl").read_text().splitlines()
    path = tmp_path / "random__seed0.jsonl"
    path.write_text("\n".join(edit(lines)) + "\n")
    with pytest.raises(FlowerRecordsError, match=match) as info:
        read_flower_records(path)
    assert str(path) in str(info.value)


def test_a_comparison_run_file_is_not_taken_for_flower_records(tmp_path):
    h = History.from_dict({"rounds": []})
    path = tmp_path / "random__seed0.jsonl"
    path.write_text(json.dumps({"key": "k", "label": "random", "seed": 0, "history": h.to_dict()}) + "\n")
    with pytest.raises(FlowerRecordsError, match=rf"{path}, line 1: not a round"):
        read_flower_records(path)


def test_a_folder_with_a_file_named_otherwise_is_an_error_naming_it(records, tmp_path):
    folder, _ = records
    shutil.copy(folder / "random__seed0.jsonl", tmp_path / "random__seed0.jsonl")
    shutil.copy(folder / "random__seed1.jsonl", tmp_path / "random-1.jsonl")
    with pytest.raises(FlowerRecordsError, match=r"random-1.jsonl: a records file in a folder is named"):
        load_flower_records(tmp_path, 0.5)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FlowerRecordsError, match=r"empty: no records files"):
        load_flower_records(tmp_path / "empty", 0.5)
    with pytest.raises(FlowerRecordsError, match=r"not-there: no such file or folder"):
        load_flower_records(tmp_path / "not-there", 0.5)


def test_the_command_line_writes_the_report_of_a_folder_of_records(records, tmp_path, capsys):
    from fedselect.cli import main

    folder, _ = records
    out = tmp_path / "report"
    assert main(["flower-report", str(folder), "--target", "0.5", "--out", str(out)]) == 0
    assert {"table.md", "paired.md", "accuracy.png", "results.csv"} <= {p.name for p in out.iterdir()}
    assert "round-robin" in capsys.readouterr().out
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["flower-report", str(empty)]) == 2
    assert f"{empty}: no records files" in capsys.readouterr().err
