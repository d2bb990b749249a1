"""KilnError: what every failed call raises, with the gRPC code's name and kilnd's message."""
import contextlib

import grpc


class KilnError(Exception):
    """A call kilnd refused or could not answer.

    code: the gRPC status code's name ("NOT_FOUND", "INVALID_ARGUMENT", "UNAUTHENTICATED", ...,
    or "DATA_LOSS" for an export whose sha256 did not match); message: kilnd's words.
    """

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    def __reduce__(self):  # picklable (multiprocessing), though __init__ takes two arguments
        return (KilnError, (self.code, self.message))


# Said after gRPC's own words where the code alone leaves a user guessing what to change.
_HINTS = {
    "UNAUTHENTICATED": "kilnd refused the credentials; pass token= (or set KILN_TOKEN)",
    "UNAVAILABLE": "is kilnd running there, and plaintext or TLS as this client (tls_ca=)?",
}

# gRPC's words for a connection that failed, as opposed to kilnd answering UNAVAILABLE itself
# (shutting down, a model being unloaded).
_CONNECT_FAILURES = ("failed to connect", "socket closed", "connection reset",
                     "connection refused", "handshake", "connect failed")


def from_rpc_error(error, address):
    """The KilnError for a grpc.RpcError raised by a call to kilnd at `address`."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    name = code.name if isinstance(code, grpc.StatusCode) else str(code)
    message = error.details() if hasattr(error, "details") else str(error)
    message = message or name.lower().replace("_", " ")
    if name == "UNAVAILABLE" and any(s in message.lower() for s in _CONNECT_FAILURES):
        message = f"cannot reach kilnd at {address}: {message} ({_HINTS[name]})"
    elif name == "UNAUTHENTICATED":
        message = f"{message} ({_HINTS[name]})"
    return KilnError(name, message)


@contextlib.contextmanager
def raised_as_kiln_error(address):
    """Turns a grpc.RpcError inside the block into a KilnError without gRPC's internals chained
    to it (`from None`): callers see the code and kilnd's message, not a channel traceback."""
    try:
        yield
    except grpc.RpcError as e:
        raise from_rpc_error(e, address) from None
