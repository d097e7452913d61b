"""FederationClients' default makes the Flower path choose the simulator's clients (README, docs/flower.rst).

The claim: with ``FederationClients``' default (``pooled_losses=True``) each client reports the
loss the simulator computes when it evaluates every client in one pass, to the last bit, and
FedCor (whose GP turns 1e-8 differences into different choices) chooses in Flower exactly the
clients it chooses in the simulator. With ``pooled_losses=False`` (a client's own forward pass)
both fail on this federation: the losses differ in the last bits and FedCor parts from the
simulator at its first GP round.
"""

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Context, RecordDict

import fedselect
from fedselect import FederatedTrainer, make_federation
from fedselect.flower import FederationClients, LocalGrid, SelectorStrategy

# The example app's settings (examples/flower-fedcor/pyproject.toml) on digits with 10 clients.
TRAIN = dict(model="mlp", local_steps=10, batch_size=50, lr=0.01)
FEDCOR = dict(warmup_rounds=2, gp_interval=2)


def _context(k):
    return Context(run_id=1, node_id=k, node_config={"partition-id": k}, state=RecordDict(), run_config={})


def test_default_losses_are_the_simulators_pooled_losses():
    fed = make_federation("digits", partition="shards", n_clients=20, random_state=0)
    clients = FederationClients(fed, model="mlp", local_steps=3, batch_size=16, lr=0.05, random_state=0)
    assert clients.pooled_losses is True
    eng = clients.engine
    arrays = [a.numpy() for a in clients.initial_arrays().values()]
    flat = clients._flat(arrays)
    for model in (flat, flat * 0.5 + 0.01):
        values = clients._split(model)
        pooled = eng.client_losses(model, None)
        reported = np.array([clients.evaluate(values, {}, _context(k))[0] for k in range(fed.n_clients)])
        np.testing.assert_array_equal(reported, pooled)
    # What the default avoids: a client's own pass rounds differently for some clients here.
    single = np.array([eng.client_losses(flat, np.array([k]))[0] for k in range(fed.n_clients)])
    assert (single != eng.client_losses(flat, None)).any(), "this federation no longer shows the difference"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fedcor_chooses_what_the_simulator_chooses_by_default(seed):
    rounds, n = 8, 10
    fed = make_federation("digits", partition="shards", shards_per_client=2, n_clients=n, random_state=seed)
    with pytest.warns(UserWarning, match="rank"):
        trainer = FederatedTrainer(
            selector=fedselect.get_selector("fedcor", **FEDCOR), clients_per_round=3, rounds=rounds,
            aggregation="data-size", random_state=seed, **TRAIN,
        ).fit(fed)
    clients = FederationClients(fed, random_state=seed, **TRAIN)  # the default: pooled losses
    strategy = SelectorStrategy(fedselect.get_selector("fedcor", **FEDCOR), clients_per_round=3, n_clients=n,
                                aggregation="data-size", random_state=seed)
    with pytest.warns(UserWarning, match="rank"):
        strategy.start(LocalGrid(clients.client_app(), n, seed=0), clients.initial_arrays(), num_rounds=rounds,
                       evaluate_fn=clients.evaluate_fn())
    sim = [r.clients for r in trainer.history_.rounds]
    flower = [r.clients for r in strategy.rounds_]
    assert len(flower) == rounds
    # Rounds 0-1 are FedCor's warm-up (random); the GP chooses from round 2 on.
    assert flower == sim


def test_federation_clients_take_a_device_and_refuse_an_absent_one():
    import torch

    from fedselect.flower import FederationClients

    fed = make_federation("digits", partition="shards", n_clients=6, random_state=0)
    clients = FederationClients(fed, model="logistic", local_steps=2, device="cpu")
    assert clients.device == torch.device("cpu") and clients.engine.device == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda"):
            FederationClients(fed, model="logistic", device="cuda")
    with pytest.raises(ValueError):
        FederationClients(fed, model="logistic", device="tpu")


def test_federation_clients_take_an_engine_path_and_refuse_a_bad_one_before_any_message():
    import torch

    from fedselect.simulation._compiled import compile_unusable

    fed = make_federation("digits", partition="shards", n_clients=6, random_state=0)
    for bad in ("fast", "", None, "Compiled"):
        with pytest.raises(ValueError, match=r"FederationClients: path=.* is not one of \['eager', 'compiled'\]"):
            FederationClients(fed, model="logistic", path=bad)
    with pytest.warns(DeprecationWarning, match=r"FederationClients: engine= is deprecated .* use path='compiled'"):
        assert FederationClients(fed, model="logistic", engine="compiled").engine_path == "compiled"  # the former name
    with pytest.raises(ValueError, match=r"path='compiled' and its deprecated name engine='eager' are both set"):
        FederationClients(fed, model="logistic", path="compiled", engine="eager")
    def tanh_mlp(shape, n_out):  # not a Flatten/Linear/ReLU/Dropout chain
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(int(np.prod(shape)), 8), torch.nn.Tanh(),
                                   torch.nn.Linear(8, n_out))

    tanh = FederationClients(fed, model=tanh_mlp, local_steps=2, path="compiled")
    with pytest.raises(ValueError, match=r"FederationClients: path='compiled' compiles .*Sequen"):
        tanh.initial_arrays()  # on the server, before any message is sent
    if compile_unusable() is not None:
        pytest.skip(f"torch.compile (inductor) is unusable here: {compile_unusable()}")

    def update(engine):
        clients = FederationClients(fed, model="logistic", local_steps=3, batch_size=8, lr=0.1, path=engine)
        arrays = [a.numpy() for a in clients.initial_arrays().values()]
        deltas, metrics = clients.train(arrays, {"fedselect-round": 0}, _context(2))
        return clients, np.concatenate([d.ravel() for d in deltas]), metrics

    clients, compiled, metrics = update("compiled")
    assert clients.engine.path == "compiled" and metrics["fedselect-local-steps"] == 3
    again, eager = update("compiled")[1], update("eager")[1]
    assert compiled.tobytes() == again.tobytes()  # the same call, the same bits
    assert np.abs(compiled).max() > 0 and np.allclose(compiled, eager, atol=1e-5)  # the same training, rounded apart
