"""The batched engine equals plain per-client training, and evaluates per client in one pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedselect.simulation.engine import Engine, LocalSchedule
from fedselect.simulation.models import FedCorCNN, FedCorMLP, LogisticRegression


def _data(n=400, shape=(1, 8, 8), seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, *shape)).astype(np.float32)
    y = rng.integers(0, 10, size=n)
    # unequal clients, so step counts and last batches differ
    cuts = np.cumsum([37, 90, 13, 150])
    parts = np.split(rng.permutation(n), cuts)
    return X, y, parts


def _reference_train(model, theta, batches, X, y, *, lr, weight_decay, prox_mu):
    """Research-code style: one client after another, torch.optim.SGD on its own copy."""
    out = []
    for bs in batches:
        torch.nn.utils.vector_to_parameters(theta.clone(), model.parameters())
        opt = torch.optim.SGD(model.parameters(), lr=lr, weight_decay=weight_decay)
        for ix in bs:
            opt.zero_grad()
            loss = F.cross_entropy(model(torch.from_numpy(X[ix])), torch.from_numpy(y[ix]))
            if prox_mu:
                w = torch.nn.utils.parameters_to_vector(model.parameters())
                loss = loss + 0.5 * prox_mu * ((w - theta) ** 2).sum()
            loss.backward()
            opt.step()
        out.append(torch.nn.utils.parameters_to_vector(model.parameters()).detach() - theta)
    return torch.stack(out)


@pytest.mark.parametrize(
    ("make", "schedule", "wd", "mu"),
    [
        (lambda: FedCorMLP((1, 8, 8), 10), LocalSchedule(32, epochs=2), 1e-3, 0.0),
        (lambda: FedCorMLP((1, 8, 8), 10), LocalSchedule(16, steps=7), 0.0, 0.1),
        (lambda: LogisticRegression((1, 8, 8), 10), LocalSchedule(64, epochs=1), 1e-4, 0.0),
        (lambda: FedCorCNN((1, 20, 20), 10), LocalSchedule(20, epochs=1), 0.0, 0.0),
    ],
)
def test_batched_training_equals_per_client_loop(make, schedule, wd, mu):
    shape = (1, 20, 20) if "CNN" in repr(make()) else (1, 8, 8)
    X, y, parts = _data(shape=shape)
    torch.manual_seed(0)
    model = make()
    eng = Engine(model, X, y, parts, X[:50], y[:50])
    theta = eng.initial_parameters()
    clients = [0, 1, 2, 3, 4]
    batches = eng.client_batches(parts, schedule, seed=3, round=5, clients=clients)
    assert len({len(b) for b in batches}) > 1 or schedule.steps is not None  # step counts really differ
    batched = eng.train(theta, batches, lr=0.1, weight_decay=wd, prox_mu=mu)
    ref = _reference_train(make(), theta, batches, X, y, lr=0.1, weight_decay=wd, prox_mu=mu)
    assert batched.shape == (5, eng.n_params)
    torch.testing.assert_close(batched, ref, atol=1e-5, rtol=1e-5)


def test_minibatches_come_from_seed_round_client():
    X, y, parts = _data()
    sched = LocalSchedule(32, epochs=1)
    eng = Engine(FedCorMLP((1, 8, 8), 10), X, y, parts, X[:10], y[:10])
    a = eng.client_batches(parts, sched, seed=1, round=2, clients=[3, 1])
    b = eng.client_batches(parts, sched, seed=1, round=2, clients=[1])
    np.testing.assert_array_equal(np.concatenate(a[1]), np.concatenate(b[0]))  # independent of who else trains
    c = eng.client_batches(parts, sched, seed=1, round=3, clients=[1])
    assert not np.array_equal(np.concatenate(b[0]), np.concatenate(c[0]))
    # one epoch covers the client's data exactly once, the last batch partial
    assert sorted(np.concatenate(b[0]).tolist()) == sorted(parts[1].tolist())
    assert [len(x) for x in b[0]] == [32, 32, 26]


def test_steps_schedule_cycles_through_small_clients():
    sched = LocalSchedule(64, steps=5)
    batches = sched.batches(np.arange(10), np.random.default_rng(0))
    assert len(batches) == 5 and all(len(x) == 10 for x in batches)
    assert all(sorted(x.tolist()) == list(range(10)) for x in batches)


def test_client_losses_one_pass_equal_per_client_mean():
    X, y, parts = _data()
    torch.manual_seed(1)
    model = FedCorMLP((1, 8, 8), 10, dropout=0.5)
    eng = Engine(model, X, y, parts, X[:50], y[:50], eval_batch=64)
    theta = eng.initial_parameters()
    all_losses = eng.client_losses(theta)
    model.eval()
    with torch.no_grad():
        expected = [float(F.cross_entropy(model(torch.from_numpy(X[p])), torch.from_numpy(y[p]))) for p in parts]
    np.testing.assert_allclose(all_losses, expected, rtol=1e-5)
    np.testing.assert_allclose(eng.client_losses(theta, np.array([4, 2])), [expected[4], expected[2]], rtol=1e-5)
    loss, acc = eng.test(theta)
    assert np.isfinite(loss) and 0.0 <= acc <= 1.0


def test_dropout_is_reproducible_with_seed():
    X, y, parts = _data()
    torch.manual_seed(0)
    eng = Engine(FedCorMLP((1, 8, 8), 10, dropout=0.5), X, y, parts, X[:10], y[:10])
    theta = eng.initial_parameters()
    batches = eng.client_batches(parts, LocalSchedule(32, epochs=1), seed=0, round=0, clients=[0, 1])
    a = eng.train(theta, batches, lr=0.1, dropout_seed=7)
    b = eng.train(theta, batches, lr=0.1, dropout_seed=7)
    c = eng.train(theta, batches, lr=0.1, dropout_seed=8)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_cnn_rejects_too_small_images():
    with pytest.raises(ValueError, match="too small"):
        FedCorCNN((1, 8, 8), 10)


def test_schedule_rejects_bad_settings():
    with pytest.raises(ValueError, match="exactly one"):
        LocalSchedule(32)
    with pytest.raises(ValueError, match="batch_size"):
        LocalSchedule(0, steps=1)


@pytest.mark.parametrize("make", [lambda: FedCorMLP((1, 8, 8), 10), lambda: LogisticRegression((1, 8, 8), 10)])
def test_hand_batched_chain_equals_vmap_forward(make):
    from torch.func import vmap

    X, y, parts = _data()
    torch.manual_seed(0)
    eng = Engine(make(), X, y, parts, X[:10], y[:10])
    assert eng._plan is not None  # the fast path is taken for the built-in chains
    stacked = eng.initial_parameters().unsqueeze(0).repeat(3, 1) + 0.01 * torch.randn(3, eng.n_params)
    xb = torch.from_numpy(X[:48]).view(3, 16, 1, 8, 8)
    fast = eng._forward_chain(stacked, xb)
    slow = vmap(eng._forward)(stacked, xb)
    torch.testing.assert_close(fast, slow, atol=1e-6, rtol=1e-5)
    assert Engine(FedCorCNN((1, 20, 20), 10), *_data(shape=(1, 20, 20))[:3], X[:1], y[:1])._plan is None


def _padded_reference(eng, theta, batches, *, lr, weight_decay, prox_mu, momentum, dropout_seed):
    """The chain's training as it was before finished clients stopped computing: every client, every step."""
    C = len(batches)
    S = max(len(b) for b in batches)
    B = max(len(x) for bs in batches for x in bs)
    idx = torch.zeros((S, C, B), dtype=torch.int64)
    mask = torch.zeros((S, C, B))
    for i, bs in enumerate(batches):
        for s, x in enumerate(bs):
            idx[s, i, : len(x)] = torch.from_numpy(x)
            mask[s, i, : len(x)] = 1.0
    active = (mask.sum(2) > 0).float()
    denom = mask.sum(2).clamp_min(1.0)
    params = theta.unsqueeze(0).repeat(C, 1)
    anchor = theta.unsqueeze(0)
    velocity = None
    eng.model.train()
    torch.manual_seed(dropout_seed)
    for s in range(S):
        p = params.requires_grad_(True)
        out = eng._forward_chain(p, eng.X[idx[s]])  # F.dropout on all C clients, from the global generator
        losses = F.cross_entropy(out.flatten(0, 1), eng.y[idx[s]].flatten(0, 1), reduction="none").view(C, B)
        (g,) = torch.autograd.grad(((losses * mask[s]).sum(1) / denom[s]).sum(), p)
        with torch.no_grad():
            g = g + weight_decay * params
            g = g + prox_mu * (params - anchor)
            velocity = g if velocity is None else momentum * velocity + g
            params = params.detach() - lr * active[s].unsqueeze(1) * velocity
    return (params - anchor).detach()


@pytest.mark.parametrize(
    "options",
    [dict(weight_decay=1e-3, prox_mu=0.1, momentum=0.9), dict(weight_decay=1e-3, prox_mu=0.1), {}],
    ids=["momentum", "decay-prox", "plain"],
)
def test_finished_clients_stop_computing_without_changing_any_bit(digits_fed, options):
    """Clients with fewer local steps drop out of the batched step once done; the numbers are those of the padded
    computation bit for bit (dropout masks included), so runs recorded before are reproduced exactly (with
    momentum, and without, where the update scales the gradient in place). The MLP's layers mix the two
    gradient layouts (its 64x64 layer is laid out as the weight where that has autograd's bits, its output layer
    never: :func:`~fedselect.simulation.engine.chain.same_bits_contiguous`).

    This holds where every client's block of every batched product starts 16-byte aligned (batch x width a
    multiple of 4 floats for each layer, as in every recorded setting: batches of 16, 32, 50 and 64 on even
    widths). Elsewhere MKL rounds a client's product by its address, so the chain's longest-first order, which
    moves clients to other places, can change the last bits (``docs/devices.rst``, Reproducibility)."""
    from fedselect.data import make_federation

    fed = make_federation("digits", partition="dirichlet", alpha=0.3, n_clients=10, random_state=4)
    torch.manual_seed(0)
    eng = Engine(FedCorMLP(fed.input_shape, fed.n_classes, dropout=0.5), fed.X, fed.y, fed.loss_indices,
                 fed.X_test, fed.y_test)
    chosen = [2, 0, 7, 5, 9]
    batches = eng.client_batches(fed.client_indices, LocalSchedule(16, epochs=2), 3, 1, chosen)
    assert len({len(b) for b in batches}) > 2  # clients of several lengths, in no particular order
    theta = eng.initial_parameters()
    kw = dict(lr=0.05, weight_decay=0.0, prox_mu=0.0, momentum=0.0, dropout_seed=77) | options
    got = eng.train(theta, batches, **kw)
    after = torch.get_rng_state()
    want = _padded_reference(eng, theta, batches, **kw)
    assert torch.equal(got, want)
    assert torch.equal(after, torch.get_rng_state())  # the same masks were drawn


@pytest.mark.parametrize("options", [dict(momentum=0.9, weight_decay=1e-3), {}], ids=["momentum", "plain"])
def test_a_clients_numbers_do_not_depend_on_its_place_in_the_round(options):
    """The chain path reorders a round's clients (longest first) and maps the updates back: on aligned shapes and
    without dropout (whose masks follow the place), a client's update is the same bits whatever place the round
    gives it and whoever trains beside it."""
    from fedselect.data import make_federation

    fed = make_federation("digits", partition="dirichlet", alpha=0.3, n_clients=10, random_state=4)
    torch.manual_seed(0)
    eng = Engine(FedCorMLP(fed.input_shape, fed.n_classes), fed.X, fed.y, fed.loss_indices, fed.X_test, fed.y_test)
    theta = eng.initial_parameters()
    kw = dict(lr=0.05, weight_decay=0.0, prox_mu=0.0, momentum=0.0, dropout_seed=1) | options
    sched = LocalSchedule(16, epochs=2)

    def updates(clients):
        batches = eng.client_batches(fed.client_indices, sched, 3, 1, clients)
        return dict(zip(clients, eng.train(theta, batches, **kw)))

    first = updates([2, 0, 7, 5, 9])
    assert len({len(b) for b in eng.client_batches(fed.client_indices, sched, 3, 1, [2, 0, 7, 5, 9])}) > 2
    for clients in ([9, 5, 7, 0, 2], [7, 2, 9], [0]):
        for k, u in updates(clients).items():
            assert torch.equal(u, first[k]), k


def test_a_small_linear_model_keeps_autograds_bits():
    """A layer too small to probe keeps autograd's layout: a 10 -> 4 logistic regression on batches of 16 (where
    one Gaussian draw of a lone client's product agreed by chance in both layouts, and the contiguous form then
    changed the run's bits) trains as the padded autograd reference, bit for bit."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(600, 10)).astype(np.float32)
    y = rng.integers(0, 4, 600)
    parts = [np.arange(0, 40), np.arange(40, 240), np.arange(240, 304)]
    torch.manual_seed(0)
    eng = Engine(LogisticRegression((10,), 4), X, y, parts, X[:10], y[:10])
    batches = eng.client_batches(parts, LocalSchedule(16, epochs=1), seed=0, round=0, clients=[0, 1, 2])
    theta = eng.initial_parameters()
    kw = dict(lr=0.05, weight_decay=0.0, prox_mu=0.0, momentum=0.0, dropout_seed=3)
    assert torch.equal(eng.train(theta, batches, **kw), _padded_reference(eng, theta, batches, **kw))


def test_the_layout_probe_says_yes_only_where_both_layouts_have_the_same_bits():
    from fedselect.simulation.engine.chain import CONTIGUOUS_MIN_ENTRIES, same_bits_contiguous

    cpu = torch.device("cpu")
    assert not same_bits_contiguous(1, 16, 10, 4, cpu)  # below CONTIGUOUS_MIN_ENTRIES: never probed
    assert not same_bits_contiguous(3, 1, 784, 200, cpu)  # a batch of one: nothing to order
    assert 10 * 4 < CONTIGUOUS_MIN_ENTRIES <= 784 * 200
    gen = torch.Generator().manual_seed(123)  # other data than the probe's
    for k, b, fan_in, fan_out in [(10, 50, 784, 200), (10, 50, 200, 200), (5, 64, 784, 64), (10, 50, 200, 64)]:
        if same_bits_contiguous(k, b, fan_in, fan_out, cpu):
            h = torch.relu(torch.randn(k, b, fan_in, generator=gen))
            g = torch.randn(k, b, fan_out, generator=gen) * 1e-3
            assert torch.equal(torch.bmm(h.transpose(1, 2), g).transpose(1, 2), torch.bmm(g.transpose(1, 2), h))


@pytest.mark.parametrize("weight_decay", [0.0, 1e-3])
def test_a_loss_whose_gradient_is_broadcast_trains(weight_decay):
    """A user's loss whose gradient autograd returns expanded (``out.sum(1)``) trains: the update, which scales
    each gradient in place, gets a copy of it."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 5)).astype(np.float32)
    y = rng.integers(0, 3, 60)
    parts = [np.arange(0, 30), np.arange(30, 60)]
    eng = Engine(LogisticRegression((5,), 3), X, y, parts, X[:10], y[:10], loss=lambda out, t: out.sum(1))
    batches = eng.client_batches(parts, LocalSchedule(1, epochs=1), seed=0, round=0, clients=[0, 1])
    theta = eng.initial_parameters()
    deltas = eng.train(theta, batches, lr=0.01, weight_decay=weight_decay)
    assert deltas.shape == (2, theta.numel()) and bool(torch.isfinite(deltas).all()) and bool((deltas != 0).any())


def _odd_chain():
    """A chain in the other order (ReLU before dropout), with a bias-free layer and a p = 0 dropout."""
    model = FedCorMLP((1, 8, 8), 10, hidden=(12, 9), dropout=0.5)
    model.net = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 12, bias=False), torch.nn.ReLU(), torch.nn.Dropout(0.3),
        torch.nn.Linear(12, 9), torch.nn.Dropout(0.0), torch.nn.ReLU(), torch.nn.Linear(9, 10),
    )
    return model


def _dead_chain():
    """A p = 1 dropout: the layers below it get zero gradients."""
    model = FedCorMLP((1, 8, 8), 10, hidden=(9,))
    model.net = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 9), torch.nn.ReLU(), torch.nn.Dropout(1.0), torch.nn.Linear(9, 10),
    )
    return model


@pytest.mark.parametrize(
    "make",
    [
        lambda: FedCorMLP((1, 8, 8), 10, dropout=0.5),
        lambda: FedCorMLP((1, 8, 8), 10, hidden=(), dropout=0.5),
        lambda: LogisticRegression((1, 8, 8), 10),
        _odd_chain,
        _dead_chain,
    ],
    ids=["mlp-dropout", "mlp-no-hidden", "logistic", "odd-chain", "dead-chain"],
)
def test_hand_written_chain_gradient_equals_autograd_bit_for_bit(make):
    """The chain's backward pass by hand (the training path for cross-entropy) is autograd's, to the last bit."""
    from fedselect.simulation.engine import _global_dropout_masks

    X, y, parts = _data()
    torch.manual_seed(0)
    eng = Engine(make(), X, y, parts, X[:10], y[:10])
    assert eng._plan is not None
    C, B = 4, 16
    stacked = eng.initial_parameters().unsqueeze(0).repeat(C, 1) + 0.05 * torch.randn(C, eng.n_params)
    parts_ = {}
    for kind, arg in eng._plan:
        if kind == "linear":
            w, b, out_f, in_f = arg
            flat = dict(zip(eng.names, stacked.split(eng.numels, dim=1)))
            parts_[w] = flat[w].reshape(C, out_f, in_f).clone()
            if b is not None:
                parts_[b] = flat[b].reshape(C, 1, out_f).clone()
    x = torch.from_numpy(X[: C * B]).view(C, B, 1, 8, 8)
    targets = torch.from_numpy(y[: C * B]).long()
    mask = torch.ones(C, B)
    mask[1, 10:] = 0.0  # a short last batch
    mask[3] = 0.0  # a padded client
    denom = mask.sum(1).clamp_min(1.0)
    drop = [arg for kind, arg in eng._plan if kind == "dropout"]
    masks = [None if p == 0.0 else (torch.zeros(()) if p == 1.0 else _global_dropout_masks(C, B, 0, i, p, w))
             for i, (p, w) in enumerate(zip(drop, _dropout_widths(eng)))]
    eng.model.train()
    leaves = {n: v.detach().requires_grad_(True) for n, v in parts_.items()}
    out = eng._chain(leaves, x, lambda i, h: masks[i])
    losses = F.cross_entropy(out.flatten(0, 1), targets, reduction="none").view(C, B)
    want = torch.autograd.grad(((losses * mask).sum(1) / denom).sum(), [leaves[n] for n in eng.names])
    weights = torch.ones(C).div_(denom).unsqueeze(1).expand(C, B) * mask
    with torch.no_grad():
        got = eng._chain_grads(parts_, x, lambda i, h: masks[i], targets, weights)
    assert len(got) == len(want)
    for n, g, w in zip(eng.names, got, want):
        assert torch.equal(g, w), n


def _dropout_widths(eng):
    widths, width = [], None
    for kind, arg in eng._plan:
        if kind == "linear":
            width = arg[2]
        elif kind == "dropout":
            widths.append(width)
    return widths
