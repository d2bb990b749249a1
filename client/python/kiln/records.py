"""Plain records of what kilnd reports (jobs, checkpoints, datasets, models): names for enums,
datetimes for timestamps. Each keeps the full message as `.proto` for the fields left out."""
import dataclasses
import datetime
from typing import Any, Optional

from kiln.stubs import spec_pb2, training_pb2


def enum_name(enum, value, prefix):
    """training_pb2 enum `value` without its prefix: JOB_STATE_RUNNING -> "RUNNING"."""
    name = enum.Name(value)
    return name[len(prefix):] if name.startswith(prefix) else name


def _time(ts):
    if ts.seconds == 0 and ts.nanos == 0:
        return None
    return ts.ToDatetime(tzinfo=datetime.timezone.utc)


@dataclasses.dataclass
class Checkpoint:
    """One checkpoint file of a job. kind: "periodic", "best", "on_demand", "shutdown", "final",
    as kilnd's file names and metrics and the kiln CLI spell it."""
    id: int
    job_id: str
    kind: str
    epochs_done: int
    global_step: int
    test_accuracy: float
    size_bytes: int
    sha256: str
    path: str
    create_time: Optional[datetime.datetime]
    proto: Any = dataclasses.field(repr=False)

    @classmethod
    def from_proto(cls, c):
        return cls(c.id, c.job_id,
                   enum_name(training_pb2.CheckpointKind, c.kind, "CHECKPOINT_KIND_").lower(),
                   c.epochs_done, c.global_step, c.test_accuracy, c.size_bytes, c.sha256, c.path,
                   _time(c.create_time), c)


def _owner(o):
    """ "user/team", "user" for an admin of no team, "" for none."""
    if not o.user and not o.team:
        return ""
    return f"{o.user}/{o.team}" if o.team else o.user


@dataclasses.dataclass
class Job:
    """A job as kilnd knows it. name, labels: the spec's display name and labels; state:
    "QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"; last_epoch: the latest finished
    epoch's metrics (an EpochEvent's fields) or None; owner: "user/team" of whoever submitted it
    ("" before identities or without auth); priority: "LOW", "NORMAL" or "HIGH"."""
    id: str
    name: str
    labels: dict
    state: str
    reason: str
    device: str
    epochs: int
    epochs_done: int
    global_step: int
    best_test_accuracy: float
    parameter_count: int
    attempts: int
    last_epoch: Optional[dict]
    create_time: Optional[datetime.datetime]
    start_time: Optional[datetime.datetime]
    end_time: Optional[datetime.datetime]
    owner: str
    priority: str
    proto: Any = dataclasses.field(repr=False)

    FINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELLED")

    @property
    def done(self):
        """Whether the job is in a final state (it may still be resumed)."""
        return self.state in self.FINAL_STATES

    @classmethod
    def from_proto(cls, j):
        last = None
        if j.HasField("last_epoch") and j.last_epoch.epoch > 0:
            e = j.last_epoch
            last = dict(epoch=e.epoch, train_loss=e.train_loss, train_accuracy=e.train_accuracy,
                        test_loss=e.test_loss, test_accuracy=e.test_accuracy,
                        samples_per_sec=e.samples_per_sec)
        return cls(j.id, j.spec.name, dict(j.spec.labels),
                   enum_name(training_pb2.JobState, j.state, "JOB_STATE_"), j.reason,
                   j.device, j.epochs, j.epochs_done, j.global_step, j.best_test_accuracy,
                   j.parameter_count, j.attempts, last, _time(j.create_time),
                   _time(j.start_time), _time(j.end_time), _owner(j.owner),
                   enum_name(spec_pb2.Priority, j.spec.priority or spec_pb2.PRIORITY_NORMAL, "PRIORITY_"), j)


@dataclasses.dataclass
class Dataset:
    """A dataset under kilnd's data dir. format: "IDX", "CIFAR10", "CSV", "NPY", "TEXT" or
    "TOKENS". Token datasets (TEXT, TOKENS) have no samples: train_tokens and val_tokens count
    their tokens, vocab_size is a text corpus's vocabulary (0 for TOKENS: the model's), max_token
    the largest token id."""
    name: str
    format: str
    train_samples: int
    test_samples: int
    sample_shape: tuple
    num_classes: int
    size_bytes: int
    train_tokens: int
    val_tokens: int
    vocab_size: int
    max_token: int
    proto: Any = dataclasses.field(repr=False)

    @classmethod
    def from_proto(cls, d):
        return cls(d.name, enum_name(training_pb2.DatasetFormat, d.format, "DATASET_FORMAT_"),
                   d.train_samples, d.test_samples, tuple(d.sample_shape), d.num_classes,
                   d.size_bytes, d.train_tokens, d.val_tokens, d.vocab_size, d.max_token, d)


@dataclasses.dataclass
class ModelStatus:
    """One version of a served model, as the repository index lists it. state: "READY",
    "UNAVAILABLE", ...; reason: why it is not ready."""
    name: str
    version: str
    state: str
    reason: str
