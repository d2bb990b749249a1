"""Client: kilnd's training service (kiln.v1.Training) and its KServe v2 serving
(inference.GRPCInferenceService with the model-repository extension), for Python users."""
import hashlib
import os
import tempfile

from kiln import connection, specs, tensors, uploads
from kiln.errors import KilnError, raised_as_kiln_error
from kiln.events import StateEvent, event_from_proto
from kiln.records import Checkpoint, Dataset, Job, ModelStatus
from kiln.stubs import (generation_grpc, generation_pb2, inference_grpc, inference_pb2,
                        training_grpc, training_pb2)

# Calls that wait on training or loading get longer deadlines than plain lookups.
_CALL_SECONDS = 30
_LOAD_SECONDS = 300
# kilnd ends a generation after its --web_stream_max_duration (5 minutes by default).
_GENERATE_SECONDS = 1800
_TRANSFER_SECONDS = 1800


def _job_id(job):
    """The id of `job`: a Job record or an id string."""
    return job.id if isinstance(job, Job) else str(job)


class Client:
    """A connection to kilnd. Every method raises KilnError (code name and kilnd's message) when
    kilnd refuses or cannot be reached; `job` arguments take a job id or a Job.

    address: HOST:PORT (default: $KILN_SERVER, else localhost:7070). token: sent as
    "authorization: Bearer TOKEN" on every call (default: $KILN_TOKEN). tls_ca: the PEM file of
    the CA that signed kilnd's certificate; any tls_* argument turns TLS on (tls_cert and tls_key
    for mutual TLS, tls_server_name to verify the certificate for another name than the host).
    """

    def __init__(self, address=None, token=None, tls_ca=None, *, tls_cert=None, tls_key=None,
                 tls_server_name=None, connect_timeout=5.0):
        self.address = address or os.environ.get("KILN_SERVER") or "localhost:7070"
        token = token if token is not None else os.environ.get("KILN_TOKEN")
        self._metadata = connection.call_metadata(token)
        self._channel = connection.open_channel(self.address, tls_ca, tls_cert, tls_key,
                                                tls_server_name, connect_timeout)
        self._training = training_grpc.TrainingStub(self._channel)
        self._inference = inference_grpc.GRPCInferenceServiceStub(self._channel)
        self._generation = generation_grpc.GenerationServiceStub(self._channel)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, request, timeout=_CALL_SECONDS):
        with raised_as_kiln_error(self.address):
            return method(request, metadata=self._metadata, timeout=timeout)

    # Training jobs.

    def submit(self, spec=None, **overrides):
        """Queues a training job and returns it (state "QUEUED"). `spec`: a dict in the JSON form
        of examples/*.json (enum values by full or plain name: "KIND_ADAM" or "adam"), a preset
        name ("mnist-mlp", "mnist-cnn"), the path of a .json spec or a JobSpec. `overrides` set
        JobSpec fields as `kiln submit`'s flags do: dataset=, epochs=, batch_size=, lr=, seed=,
        device=, or any other field by name. Dataset "mnist" and 1 epoch unless given."""
        message = specs.build_spec(spec, **overrides)
        return Job.from_proto(
            self._call(self._training.SubmitJob, training_pb2.SubmitJobRequest(spec=message)))

    def get(self, job):
        """The job with its latest progress."""
        return Job.from_proto(
            self._call(self._training.GetJob, training_pb2.GetJobRequest(job_id=_job_id(job))))

    def jobs(self, states=None, labels=None):
        """Every job, newest first; only those in `states` ("RUNNING", ...) when given, and only
        those carrying every label of `labels` ({"team": "vision"}; a value of None: any value),
        filtered here as `kiln jobs --label` does."""
        names = [s.upper() for s in states or ()]
        unknown = [s for s in names if "JOB_STATE_" + s not in training_pb2.JobState.keys()]
        if unknown:
            raise KilnError("INVALID_ARGUMENT", f"jobs: unknown state {', '.join(unknown)} (one "
                            "of QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED)")
        wanted = [training_pb2.JobState.Value("JOB_STATE_" + s) for s in names]
        out, token = [], ""
        while True:
            page = self._call(self._training.ListJobs, training_pb2.ListJobsRequest(
                states=wanted, page_size=1000, page_token=token))
            out.extend(Job.from_proto(j) for j in page.jobs
                       if all(k in j.spec.labels and (v is None or j.spec.labels[k] == v)
                              for k, v in (labels or {}).items()))
            token = page.next_page_token
            if not token:
                return out

    def cancel(self, job):
        """Cancels a queued or running job (FAILED_PRECONDITION for a finished one)."""
        return Job.from_proto(self._call(self._training.CancelJob,
                                         training_pb2.CancelJobRequest(job_id=_job_id(job))))

    def resume(self, job, epochs=0, checkpoint=None):
        """Queues a finished job again from its newest checkpoint that verifies, or from
        `checkpoint` ("best", an id or a Checkpoint), for `epochs` epochs in all when given."""
        return Job.from_proto(self._call(self._training.ResumeJob, training_pb2.ResumeJobRequest(
            job_id=_job_id(job), epochs=epochs,
            checkpoint_id=self._checkpoint_id(job, checkpoint))))

    def watch(self, job, steps=True, live_only=False):
        """Yields the job's events as they happen: StateEvent, StepEvent (unless steps=False),
        EpochEvent and CheckpointEvent, the recorded history first (unless live_only), ending
        after the event of a final state. Leaving the loop early stops the stream; the job goes
        on."""
        request = training_pb2.WatchJobRequest(job_id=_job_id(job), include_steps=steps,
                                               live_only=live_only)
        with raised_as_kiln_error(self.address):
            call = self._training.WatchJob(request, metadata=self._metadata)
        try:
            with raised_as_kiln_error(self.address):
                for message in call:
                    event = event_from_proto(message)
                    if event is not None:
                        yield event
        finally:
            call.cancel()

    def wait(self, job):
        """Blocks until the job reaches a final state; returns it."""
        for event in self.watch(job, steps=False, live_only=True):
            if isinstance(event, StateEvent) and event.state in Job.FINAL_STATES:
                break
        return self.get(job)

    # Checkpoints.

    def checkpoints(self, job):
        """The job's checkpoints still on disk, oldest first."""
        response = self._call(self._training.ListCheckpoints,
                              training_pb2.ListCheckpointsRequest(job_id=_job_id(job)))
        return [Checkpoint.from_proto(c) for c in response.checkpoints]

    def checkpoint(self, job):
        """Checkpoints a running job now; returns the checkpoint once written."""
        return Checkpoint.from_proto(self._call(
            self._training.CreateCheckpoint,
            training_pb2.CreateCheckpointRequest(job_id=_job_id(job)), timeout=_LOAD_SECONDS))

    def _checkpoint_id(self, job, checkpoint):
        """The id `checkpoint` names: None or "latest" is 0 (kilnd picks the newest), "best" the
        highest test accuracy (the later of equals, as `kiln export JOB@best`), else an id."""
        if checkpoint is None or checkpoint == "latest":
            return 0
        if checkpoint == "best":
            best = None
            for c in self.checkpoints(job):
                if best is None or c.test_accuracy >= best.test_accuracy:
                    best = c
            if best is None:
                raise KilnError("NOT_FOUND", f"{_job_id(job)} has no checkpoints")
            return best.id
        return int(checkpoint.id if isinstance(checkpoint, Checkpoint) else checkpoint)

    def export(self, job, path, checkpoint=None):
        """Downloads a checkpoint (None/"latest", "best", an id or a Checkpoint) as a
        safetensors file at `path` and returns its Checkpoint record. The file appears only
        once its sha256 matches kilnd's (DATA_LOSS otherwise, with nothing written)."""
        request = training_pb2.ExportCheckpointRequest(
            job_id=_job_id(job), checkpoint_id=self._checkpoint_id(job, checkpoint))
        directory = os.path.dirname(os.path.abspath(path))
        fd, temp = tempfile.mkstemp(prefix=".kiln-export-", dir=directory)
        try:
            record, server_sha, received = None, "", 0
            digest = hashlib.sha256()
            with os.fdopen(fd, "wb") as out, raised_as_kiln_error(self.address):
                call = self._training.ExportCheckpoint(request, metadata=self._metadata,
                                                       timeout=_TRANSFER_SECONDS)
                for chunk in call:
                    if record is None and chunk.HasField("checkpoint"):
                        record = Checkpoint.from_proto(chunk.checkpoint)
                    if chunk.offset != received:
                        call.cancel()
                        raise KilnError("DATA_LOSS", f"chunk at offset {chunk.offset} but "
                                        f"{received} bytes received")
                    out.write(chunk.data)
                    digest.update(chunk.data)
                    received += len(chunk.data)
                    server_sha = chunk.sha256 or server_sha
                out.flush()
                os.fsync(out.fileno())
            if record is None or not server_sha:
                raise KilnError("DATA_LOSS", "kilnd sent no checkpoint record or no sha256")
            if server_sha.lower() != digest.hexdigest():
                raise KilnError("DATA_LOSS", f"sha256 mismatch: kilnd says {server_sha}, the "
                                f"received file has {digest.hexdigest()}; nothing was written")
            os.replace(temp, path)
            temp = None
            return record
        finally:
            if temp is not None:
                os.unlink(temp)

    # Datasets.

    def whoami(self):
        """Who kilnd takes this client's token for: {"user", "team", "role", "auth"} (role
        "viewer", "member" or "admin"; auth False when kilnd checks no tokens)."""
        r = self._call(self._training.WhoAmI, training_pb2.WhoAmIRequest())
        return {"user": r.user, "team": r.team, "role": r.role, "auth": r.auth}

    def datasets(self):
        """The datasets under kilnd's data dir that this caller sees, by name."""
        response = self._call(self._training.ListDatasets, training_pb2.ListDatasetsRequest())
        return [Dataset.from_proto(d) for d in response.datasets]

    def upload(self, name, train_images, train_labels, test_images=None, test_labels=None):
        """Uploads a dataset as `name` and returns it. Each argument is a numpy array (sent as
        .npy: images uint8 of shape (N, ...) or float32 features (N, F), labels (N,) integers) or
        the path of an IDX file (gzip or not), all four of one kind; the test pair is optional."""
        parts = [train_images, train_labels]
        if (test_images is None) != (test_labels is None):
            raise KilnError("INVALID_ARGUMENT", "test_images and test_labels go together")
        if test_images is not None:
            parts += [test_images, test_labels]
        paths = [isinstance(p, (str, os.PathLike)) for p in parts]
        if all(paths):
            files = []
            for server_name, p in zip(uploads.IDX_NAMES, parts):
                data = uploads.read_file(p)
                files.append((server_name + (".gz" if data[:2] == b"\x1f\x8b" else ""), data))
            fmt = training_pb2.DATASET_FORMAT_IDX
        elif not any(paths):
            files = [(n, uploads.npy_bytes(p, labels=i % 2 == 1))
                     for i, (n, p) in enumerate(zip(uploads.NPY_NAMES, parts))]
            fmt = training_pb2.DATASET_FORMAT_NPY
        else:
            raise KilnError("INVALID_ARGUMENT", "upload: give all paths of IDX files or all "
                            "numpy arrays, not a mix")
        return self._upload(training_pb2.UploadDatasetHeader(name=name, format=fmt), files)

    def upload_csv(self, name, train, test=None, label_column=None, header=None,
                   test_fraction=0.0):
        """Uploads CSV tables (paths) as dataset `name`: numeric features and one integer label
        column (`label_column`, a header name or index; default the last). header: True, False
        or None (guessed). test_fraction: the share of train's last rows to test on when there
        is no test table."""
        csv = training_pb2.CsvOptions(label_column=str(label_column or ""),
                                      test_fraction=test_fraction)
        if header is not None:
            csv.header = bool(header)
        files = [("train.csv", uploads.read_file(train))]
        if test is not None:
            files.append(("test.csv", uploads.read_file(test)))
        return self._upload(training_pb2.UploadDatasetHeader(
            name=name, format=training_pb2.DATASET_FORMAT_CSV, csv=csv), files)

    def upload_text(self, name, paths, val_fraction=0.1):
        """Uploads a text corpus (UTF-8 files, concatenated in the order given) as dataset `name`
        for a character-level language model. kilnd builds the vocabulary (the sorted set of
        characters) and keeps the first 1 - val_fraction of the corpus as the train split and the
        rest for validation, as token shards and vocab.json (not the text)."""
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        files = [(os.path.basename(os.fspath(p)), uploads.FileOnDisk(p)) for p in paths]
        return self._upload(training_pb2.UploadDatasetHeader(
            name=name, format=training_pb2.DATASET_FORMAT_TEXT, val_fraction=val_fraction), files)

    def upload_tokens(self, name, train, val=()):
        """Uploads llm.c token shards (.bin paths) as dataset `name`: `train` and `val` in order,
        stored as train_000.bin ... and val_000.bin ...; the vocabulary is the job's model's."""
        if isinstance(train, (str, os.PathLike)):
            train = [train]
        if isinstance(val, (str, os.PathLike)):
            val = [val]
        files = [(f"train_{i:03d}.bin", uploads.FileOnDisk(p)) for i, p in enumerate(train)]
        files += [(f"val_{i:03d}.bin", uploads.FileOnDisk(p)) for i, p in enumerate(val)]
        return self._upload(training_pb2.UploadDatasetHeader(
            name=name, format=training_pb2.DATASET_FORMAT_TOKENS), files)

    def _upload(self, header, files):
        requests = uploads.upload_requests(header, files)
        return Dataset.from_proto(self._call(self._training.UploadDataset, requests,
                                             timeout=_TRANSFER_SECONDS))

    def delete_dataset(self, name):
        """Deletes a dataset (FAILED_PRECONDITION while queued or running jobs use it)."""
        self._call(self._training.DeleteDataset, training_pb2.DeleteDatasetRequest(name=name))

    # Serving.

    def deploy(self, job, name=None, checkpoint="latest", max_batch_size=None,
               max_queue_delay_us=None, version=None, device=None, version_policy=None,
               follow=False, precision=None):
        """Serves a checkpoint of `job` ("latest", "best", an id or a Checkpoint) as model `name`
        (default: the job id) and returns the name once the model is loaded. max_batch_size and
        max_queue_delay_us set its dynamic batching; device: "cpu", "cuda:N" or "auto";
        version: the version number (default: the model's next); version_policy: "latest:N",
        "all" or "specific:1,3"; follow=True loads each new checkpoint that "latest" or "best"
        then names as the next version; precision: "fp32" (kilnd's default), "tf32" or "bf16"
        (GEMM inputs rounded to bfloat16: answers close to fp32's), as model_precision() then
        says."""
        if isinstance(checkpoint, Checkpoint):
            checkpoint = checkpoint.id
        name = name or _job_id(job)
        params = {"checkpoint": inference_pb2.ModelRepositoryParameter(
            string_param=f"{_job_id(job)}@{checkpoint}")}
        if max_batch_size is not None:
            params["max_batch_size"] = inference_pb2.ModelRepositoryParameter(
                int64_param=int(max_batch_size))
        if max_queue_delay_us is not None:
            params["max_queue_delay_us"] = inference_pb2.ModelRepositoryParameter(
                int64_param=int(max_queue_delay_us))
        if follow:
            params["follow"] = inference_pb2.ModelRepositoryParameter(string_param="true")
        for key, value in (("version", version), ("device", device),
                           ("version_policy", version_policy), ("precision", precision)):
            if value is not None:
                params[key] = inference_pb2.ModelRepositoryParameter(string_param=str(value))
        self._call(self._inference.RepositoryModelLoad,
                   inference_pb2.RepositoryModelLoadRequest(model_name=name, parameters=params),
                   timeout=_LOAD_SECONDS)
        return name

    def undeploy(self, name, version=None):
        """Stops serving model `name` (only `version` when given)."""
        params = {}
        if version is not None:
            params["version"] = inference_pb2.ModelRepositoryParameter(string_param=str(version))
        self._call(self._inference.RepositoryModelUnload,
                   inference_pb2.RepositoryModelUnloadRequest(model_name=name, parameters=params),
                   timeout=_LOAD_SECONDS)

    def model_precision(self, model, version=None):
        """What served `model` (`version`, default its newest) computes in: "fp32", "tf32" or
        "bf16", as it was loaded (ModelMetadata's "precision" parameter)."""
        metadata = self._call(self._inference.ModelMetadata, inference_pb2.ModelMetadataRequest(
            name=model, version="" if version is None else str(version)))
        return metadata.parameters["precision"].string_param

    def models(self):
        """Every version of every model kilnd knows, with its state."""
        response = self._call(self._inference.RepositoryIndex,
                              inference_pb2.RepositoryIndexRequest())
        return [ModelStatus(m.name, m.version, m.state, m.reason) for m in response.models]

    def predict(self, model, array, version=None):
        """Classifies the samples in `array` (batch first; one sample may come without the batch
        dimension) with served model `model`: uint8 arrays go as raw pixels (UINT8), others as
        FP32 (pixels in [0, 1], or a table's features). Returns (probabilities, classes): numpy
        arrays of shape (batch, classes) float32 and (batch,) int64."""
        version = "" if version is None else str(version)
        metadata = self._call(self._inference.ModelMetadata, inference_pb2.ModelMetadataRequest(
            name=model, version=version))
        if not metadata.inputs:
            raise KilnError("FAILED_PRECONDITION", f"model {model} declares no inputs")
        spec = metadata.inputs[0]
        sample_shape = list(spec.shape[1:])  # after the batch dimension, which is -1
        request = tensors.infer_request(model, version, spec.name or "input", sample_shape, array)
        response = self._call(self._inference.ModelInfer, request, timeout=_LOAD_SECONDS)
        return tensors.infer_result(model, response, request.inputs[0].shape[0])

    def generate(self, model, prompt, max_tokens=200, temperature=0.8, top_k=0, seed=0,
                 version=None, stream=False):
        """Continues `prompt` with served language model `model` (a GPT): up to max_tokens tokens
        drawn at `temperature` (0: greedy) among the top_k likeliest (0: all), the same seed
        giving the same text. `prompt` is text (encoded with the checkpoint's vocabulary) or, for
        a model trained on token shards, a list of token ids. Returns the generated text (a list
        of ids for a model without a vocabulary); with stream=True, an iterator of each token's
        text (or id) as kilnd chooses it."""
        request = generation_pb2.GenerateRequest(
            model_name=model, model_version="" if version is None else str(version),
            parameters=generation_pb2.GenerationParameters(
                max_tokens=int(max_tokens), temperature=float(temperature), top_k=int(top_k),
                seed=int(seed)))
        ids_only = not isinstance(prompt, str)
        if ids_only:
            request.input_ids.ids.extend(int(i) for i in prompt)
        else:
            request.text_input = prompt
        tokens = self._generate_stream(request, ids_only)
        if stream:
            return tokens
        tokens = list(tokens)
        return tokens if ids_only else "".join(tokens)

    def _generate_stream(self, request, ids_only):
        with raised_as_kiln_error(self.address):
            for response in self._generation.Generate(request, metadata=self._metadata,
                                                      timeout=_GENERATE_SECONDS):
                yield response.token_id if ids_only else response.text_output
