"""kiln: a Python client of kilnd, the kiln training and serving daemon.

    import kiln
    client = kiln.Client("127.0.0.1:7070")
    job = client.submit("mnist-mlp", epochs=2)
    for event in client.watch(job):
        if event.kind == "epoch":
            print(event.epoch, event.test_accuracy)
    client.deploy(job, name="digits")
    probabilities, classes = client.predict("digits", images)  # numpy uint8 (N, 28, 28)

See README.md, "Python client", and examples/python_train_and_predict.py.
"""
from kiln.client import Client
from kiln.errors import KilnError
from kiln.events import CheckpointEvent, EpochEvent, Event, StateEvent, StepEvent
from kiln.records import Checkpoint, Dataset, Job, ModelStatus

__all__ = ["Client", "KilnError", "Event", "StateEvent", "StepEvent", "EpochEvent",
           "CheckpointEvent", "Job", "Checkpoint", "Dataset", "ModelStatus"]
