"""Dataset uploads: the UploadDataset request stream (a header, then each file in chunks, its
sha256 on its last chunk), from files on disk or from numpy arrays sent as .npy files."""
import hashlib
import io

from kiln.errors import KilnError
from kiln.stubs import training_pb2

CHUNK_BYTES = 1 << 20
IDX_NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
             "t10k-labels-idx1-ubyte")
NPY_NAMES = ("train_x.npy", "train_y.npy", "test_x.npy", "test_y.npy")


def read_file(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise KilnError("INVALID_ARGUMENT", f"cannot read {path}: {e.strerror}") from None


def npy_bytes(array, labels):
    """`array` as a .npy file kilnd reads: samples uint8 (any shape) or float32 (a table, (N, F)),
    labels int64 of shape (N,)."""
    import numpy as np  # only uploads of arrays need numpy

    a = np.asarray(array)
    if labels:
        a = np.ascontiguousarray(a, dtype="<i8")
    elif a.dtype != np.uint8:
        a = np.ascontiguousarray(a, dtype="<f4")
    else:
        a = np.ascontiguousarray(a)
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, a, allow_pickle=False)
    return buffer.getvalue()


class FileOnDisk:
    """A file sent as it is read, a chunk at a time (token shards and text corpora can be large),
    rather than held whole."""

    def __init__(self, path):
        self.path = path
        try:
            with open(path, "rb"):
                pass
        except OSError as e:
            raise KilnError("INVALID_ARGUMENT", f"cannot read {path}: {e.strerror}") from None


def _pieces(data):
    """(piece, last) for bytes or a FileOnDisk; an empty file is one empty last piece."""
    if isinstance(data, FileOnDisk):
        with open(data.path, "rb") as f:
            piece = f.read(CHUNK_BYTES)
            while True:
                following = f.read(CHUNK_BYTES)
                yield piece, not following
                if not following:
                    return
                piece = following
    offset = 0
    while True:
        piece = data[offset:offset + CHUNK_BYTES]
        offset += len(piece)
        yield piece, offset >= len(data)
        if offset >= len(data):
            return


def upload_requests(header, files):
    """The UploadDatasetRequest stream for `header` (an UploadDatasetHeader, whose `files` this
    fills) and `files`, a list of (server file name, bytes or FileOnDisk)."""
    header.files.extend(name for name, _ in files)
    yield training_pb2.UploadDatasetRequest(header=header)
    for name, data in files:
        sha = hashlib.sha256()
        for piece, last in _pieces(data):
            sha.update(piece)
            yield training_pb2.UploadDatasetRequest(chunk=training_pb2.DatasetFileChunk(
                file_name=name, data=piece, sha256=sha.hexdigest() if last else ""))
