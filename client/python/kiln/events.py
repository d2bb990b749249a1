"""The events Client.watch yields: one dataclass per kind of JobEvent, each with the event's
place in the job's history (seq, time, replayed, dropped_before) and a `kind` string."""
import dataclasses
import datetime
from typing import Optional

from kiln.records import Checkpoint, enum_name
from kiln.stubs import training_pb2


@dataclasses.dataclass
class Event:
    seq: int  # position in the job's history, increasing
    time: Optional[datetime.datetime]
    replayed: bool  # from the recorded history rather than live
    dropped_before: int  # live events this watcher missed just before this one (it read slowly)


@dataclasses.dataclass
class StateEvent(Event):
    """The job changed state ("QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED")."""
    state: str
    reason: str
    kind: str = "state"


@dataclasses.dataclass
class StepEvent(Event):
    """One training step (batch): its mean loss and learning rate."""
    epoch: int
    step_in_epoch: int
    steps_per_epoch: int
    global_step: int
    loss: float
    lr: float
    samples_per_sec: float
    kind: str = "step"


@dataclasses.dataclass
class EpochEvent(Event):
    """One finished epoch: training and test loss and accuracy (accuracies in [0, 1])."""
    epoch: int
    train_loss: float
    train_accuracy: float
    test_loss: float
    test_accuracy: float
    test_samples: int
    train_seconds: float
    samples_per_sec: float
    lr: float
    kind: str = "epoch"


@dataclasses.dataclass
class CheckpointEvent(Event):
    """A checkpoint was written."""
    checkpoint: Checkpoint
    kind: str = "checkpoint"


def event_from_proto(e):
    """The Event for a training_pb2.JobEvent, or None for a kind this client does not know."""
    base = (e.seq, e.time.ToDatetime(tzinfo=datetime.timezone.utc) if e.HasField("time") else None,
            e.replayed, e.dropped_before)
    which = e.WhichOneof("event")
    if which == "state":
        return StateEvent(*base, enum_name(training_pb2.JobState, e.state.state, "JOB_STATE_"),
                          e.state.reason)
    if which == "step":
        s = e.step
        return StepEvent(*base, s.epoch, s.step_in_epoch, s.steps_per_epoch, s.global_step, s.loss,
                         s.lr, s.samples_per_sec)
    if which == "epoch":
        m = e.epoch
        return EpochEvent(*base, m.epoch, m.train_loss, m.train_accuracy, m.test_loss,
                          m.test_accuracy, m.test_samples, m.train_seconds, m.samples_per_sec, m.lr)
    if which == "checkpoint":
        return CheckpointEvent(*base, Checkpoint.from_proto(e.checkpoint))
    return None
