"""The ClientApp: each node trains and evaluates its own partition (node_config["partition-id"])."""

from fedselect.flower import make_client_app

from .task import federation_clients


def train(parameters, config, context):
    return federation_clients(context.run_config).train(parameters, config, context)


def evaluate(parameters, config, context):
    return federation_clients(context.run_config).evaluate(parameters, config, context)


def num_examples(context):
    return federation_clients(context.run_config).n_samples(int(context.node_config["partition-id"]))


app = make_client_app(train, evaluate, num_examples=num_examples, train_returns="update")
