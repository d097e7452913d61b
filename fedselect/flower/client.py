"""Turn a user's own train and evaluate functions into a ClientApp that answers every fedselect message."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from . import _protocol as P

__all__ = ["make_client_app"]

TrainFn = Callable[[list[np.ndarray], dict[str, Any], Context], Any]
EvaluateFn = Callable[[list[np.ndarray], dict[str, Any], Context], Any]


def _client_id(context: Context, client_id: int | Callable[[Context], int] | None) -> int:
    if client_id is None:
        cfg = context.node_config
        if "partition-id" not in cfg:
            raise KeyError(
                "make_client_app: this node's node_config has no 'partition-id' (start the SuperNode with "
                "--node-config 'partition-id=K num-partitions=N', or pass client_id=... to make_client_app)"
            )
        value = cfg["partition-id"]
    else:
        value = client_id(context) if callable(client_id) else client_id
    if isinstance(value, bool) or int(value) != value or int(value) < 0:
        raise ValueError(f"make_client_app: client id {value!r} must be an integer >= 0")
    return int(value)


def _num_examples(context: Context, num_examples: int | Callable[[Context], int]) -> int:
    value = num_examples(context) if callable(num_examples) else num_examples
    if isinstance(value, bool) or int(value) != value or int(value) < 1:
        raise ValueError(f"make_client_app: num_examples={value!r} must be an integer >= 1 (n_k of this client)")
    return int(value)


def _config(message: Message) -> dict[str, Any]:
    rec = message.content.config_records.get("config")
    return dict(rec) if rec is not None else {}


def _model(message: Message, context: Context, config: Mapping[str, Any]) -> ArrayRecord:
    """The model a message is about: its own arrays, or the w^t this client kept earlier this round."""
    if config.get(P.CACHED):
        info = context.state.config_records.get(P.STATE_INFO)
        if info is None or int(info["round"]) != int(config[P.ROUND]):
            raise RuntimeError(
                f"fedselect client: asked to use the round-{config[P.ROUND]} global model it received earlier, "
                "but holds none for that round (the node restarted?)"
            )
        return context.state.array_records[P.STATE_MODEL]
    record = message.content.array_records.get("arrays")
    if record is None:
        raise ValueError(f"fedselect client: a {message.metadata.message_type} message without an 'arrays' model")
    if config.get(P.MODEL_KIND, "global") == "global" and P.ROUND in config:
        context.state[P.STATE_MODEL] = record
        context.state[P.STATE_INFO] = ConfigRecord({"round": int(config[P.ROUND])})
    return record


def _evaluate(evaluate_fn: EvaluateFn, model: ArrayRecord, config: dict[str, Any], context: Context):
    out = evaluate_fn(model.to_numpy_ndarrays(), config, context)
    if not isinstance(out, tuple) or len(out) not in (2, 3):
        raise TypeError("make_client_app: evaluate_fn must return (loss, n_evaluated) or (loss, n_evaluated, metrics)")
    loss, n_eval = float(out[0]), int(out[1])
    metrics = dict(out[2]) if len(out) == 3 and out[2] else {}
    return loss, n_eval, metrics


def make_client_app(
    train_fn: TrainFn,
    evaluate_fn: EvaluateFn,
    *,
    num_examples: int | Callable[[Context], int],
    client_id: int | Callable[[Context], int] | None = None,
    train_returns: str = "parameters",
) -> ClientApp:
    """A Flower ``ClientApp`` that trains and evaluates with your functions and answers fedselect's queries.

    Parameters
    ----------
    train_fn : callable
        ``train_fn(parameters, config, context) -> (result, metrics)``: train from
        ``parameters`` (the model's arrays, a list of NumPy arrays in the model's order) and
        return ``result`` (the new parameters, or the update ``w_k - w^t`` when
        ``train_returns="update"``; a list in the same order or a dict by array key) and a
        dict of metrics. Optional metric keys ``"fedselect-local-steps"`` and
        ``"fedselect-sample-gradients"`` are charged to the round's costs. ``config`` holds
        the server's train config plus ``"fedselect-round"`` (t, from 0) and
        ``"fedselect-purpose"`` (``"main"`` or ``"trial"``: a trial round's training, not applied).
        When ``config["fedselect-need-sample-loss"]`` is True (the server's selector needs
        ``"sample_losses"``, as Oort does), the metrics must hold ``"fedselect-sample-loss-sq"``:
        the mean, over every sample of every local step, of the squared per-sample training
        loss, each loss taken in that step's forward pass (Oort's statistical utility is
        ``|B_k| sqrt`` of it); a reply without it fails the client for the round.
    evaluate_fn : callable
        ``evaluate_fn(parameters, config, context) -> (loss, n_evaluated[, metrics])``: the
        client's loss l_k on its evaluation data and how many samples that took.
    num_examples : int or callable
        n_k, the client's data size (a callable receives the ``Context``). The strategy fits
        the selector with these and weighs aggregation by them.
    client_id : int or callable, optional
        The stable client id in ``0..N-1`` (Flower's node ids are random per run). Default:
        the node's ``node_config["partition-id"]`` (set by the simulation engine, or by
        ``flower-supernode --node-config "partition-id=K num-partitions=N"``).
    train_returns : {"parameters", "update"}
        What ``train_fn`` returns. ``"update"`` avoids a subtraction on the client (the
        update is uploaded exactly as computed).

        A model with buffers (batch norm statistics) sends them with its parameters, and
        ``train_fn`` returns them with the parameters: their values after local training
        (``"parameters"``), or ``b_k - b^t`` in the buffer's dtype (``"update"``; a boolean
        buffer reports ``b_k != b^t``). The server, told the buffer names
        (``SelectorStrategy(buffers=...)``), averages them rather than adding them up.

    Returns
    -------
    flwr.clientapp.ClientApp
        Answers ``train``, ``evaluate``, ``query.fedselect_hello``, ``query.fedselect_loss``
        and ``query.fedselect_update``. A train reply holds the update under ``"update"``
        and ``num-examples``; an evaluate reply holds ``"loss"`` and ``num-examples`` (the
        evaluated samples), so Flower's FedAvg aggregates it.

    Notes
    -----
    The client keeps the last global model w^t it received this round in its
    ``Context.state`` and uses it when the server omits the model from a later message
    of the same round. It never applies a selector's ``transform``: the strategy applies
    it to the uploaded update (see :class:`~fedselect.flower.SelectorStrategy`).

    Examples
    --------
    ::

        def train(parameters, config, context):
            model.load(parameters); n_steps = fit_locally(model, lr=config.get("lr", 0.05))
            return model.arrays(), {"fedselect-local-steps": n_steps}

        def evaluate(parameters, config, context):
            model.load(parameters); return loss_on_holdout(model), n_holdout

        app = make_client_app(train, evaluate, num_examples=lambda ctx: n_k)
    """
    if train_returns not in ("parameters", "update"):
        raise ValueError(f"make_client_app: train_returns={train_returns!r}; expected 'parameters' or 'update'")
    app = ClientApp()

    def _train_reply(message: Message, context: Context) -> Message:
        config = _config(message)
        model = _model(message, context, config)
        metrics: dict[str, Any] = {
            P.CLIENT_ID: _client_id(context, client_id),
            P.NUM_EXAMPLES: _num_examples(context, num_examples),
        }
        if config.get(P.NEED_LOSS):
            loss, n_eval, _ = _evaluate(evaluate_fn, model, config, context)
            metrics[P.LOSS_KEY] = loss
            metrics[P.EVALUATED] = n_eval
        out = train_fn(model.to_numpy_ndarrays(), config, context)
        if not isinstance(out, tuple) or len(out) != 2:
            raise TypeError("make_client_app: train_fn must return (parameters_or_update, metrics)")
        result, user_metrics = out
        keys = list(model.keys())
        arrays = P.as_arrays(result, keys, "make_client_app: train_fn")
        if train_returns == "parameters":
            old = model.to_numpy_ndarrays()
            arrays = P.as_arrays(
                [P.buffer_delta(arrays[k].numpy(), o) for k, o in zip(keys, old)], keys, "make_client_app"
            )
        for key in (P.STEPS, P.SAMPLE_GRADIENTS):
            if user_metrics and key in user_metrics:
                metrics[key] = int(user_metrics[key])
        if user_metrics and P.SAMPLE_LOSS_SQ in user_metrics:  # a NumPy float32 too (not a float subclass)
            metrics[P.SAMPLE_LOSS_SQ] = float(user_metrics[P.SAMPLE_LOSS_SQ])
        for key, value in dict(user_metrics or {}).items():
            if key not in metrics and isinstance(value, (int, float)) and not isinstance(value, bool):
                metrics[key] = value
        return Message(RecordDict({"update": arrays, "metrics": MetricRecord(metrics)}), reply_to=message)

    @app.train()
    def train(message: Message, context: Context) -> Message:
        return _train_reply(message, context)

    @app.query("fedselect_update")
    def update(message: Message, context: Context) -> Message:
        return _train_reply(message, context)

    @app.query("fedselect_loss")
    def loss(message: Message, context: Context) -> Message:
        config = _config(message)
        model = _model(message, context, config)
        value, n_eval, _ = _evaluate(evaluate_fn, model, config, context)
        metrics = MetricRecord({P.CLIENT_ID: _client_id(context, client_id), P.LOSS_KEY: value, P.EVALUATED: n_eval})
        return Message(RecordDict({"metrics": metrics}), reply_to=message)

    @app.query("fedselect_hello")
    def hello(message: Message, context: Context) -> Message:
        metrics: dict[str, Any] = {
            P.CLIENT_ID: _client_id(context, client_id),
            P.NUM_EXAMPLES: _num_examples(context, num_examples),
        }
        if "num-partitions" in context.node_config:
            metrics[P.NUM_PARTITIONS] = int(context.node_config["num-partitions"])
        return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=message)

    @app.evaluate()
    def evaluate(message: Message, context: Context) -> Message:
        config = _config(message)
        arrays = next(iter(message.content.array_records.values()), None)
        if arrays is None:
            raise ValueError("fedselect client: an evaluate message without a model")
        value, n_eval, extra = _evaluate(evaluate_fn, arrays, config, context)
        metrics = {P.LOSS_KEY: value, P.NUM_EXAMPLES: n_eval}
        metrics.update({k: v for k, v in extra.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
        return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=message)

    return app
