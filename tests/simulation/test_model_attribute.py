"""The trained global model comes back as a module (issue 25's first-hour list)."""

import numpy as np
import torch

import fedselect


def test_model_is_the_final_global_model_as_a_module():
    fed = fedselect.make_federation("digits", partition="iid", n_clients=8, random_state=0)
    trainer = fedselect.FederatedTrainer(selector="random", clients_per_round=4, rounds=5, local_steps=5,
                                         batch_size=16, lr=0.1, random_state=0).fit(fed)
    model = trainer.model_
    assert isinstance(model, torch.nn.Module) and not model.training
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    assert np.array_equal(flat, trainer.parameters_)
    with torch.no_grad():
        logits = model(torch.as_tensor(fed.X_test, dtype=torch.float32))
    accuracy = float((logits.argmax(1).numpy() == fed.y_test).mean())
    assert accuracy == trainer.history_.rounds[-1].test_accuracy
    # A copy: changing it leaves the trainer's record alone.
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    assert np.array_equal(trainer.parameters_, flat)
