"""The channel to kilnd: address, TLS and the bearer token, as the `kiln` CLI makes them."""
import grpc

from kiln.errors import KilnError

# Exports stream 1 MiB chunks and predictions of large batches exceed gRPC's 4 MiB default;
# kilnd enforces its own limits on what it is sent.
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.max_send_message_length", -1),
    # A channel of its own, as the CLI's: a new Client does not inherit another's backoff.
    ("grpc.use_local_subchannel_pool", 1),
]


def _read(path, what):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise KilnError("INVALID_ARGUMENT", f"{what}: cannot read {path}: {e.strerror}") from None


def open_channel(address, tls_ca=None, tls_cert=None, tls_key=None, tls_server_name=None,
                 connect_timeout=5.0):
    """A grpc.Channel to kilnd, ready. Any TLS argument turns TLS on (tls_ca None: the system's
    CAs); none means plaintext. Raises KilnError UNAVAILABLE when kilnd does not answer within
    connect_timeout seconds, INVALID_ARGUMENT for an unreadable file or a cert without its key."""
    tls = any(x is not None for x in (tls_ca, tls_cert, tls_key, tls_server_name))
    options = list(_CHANNEL_OPTIONS)
    if tls:
        if (tls_cert is None) != (tls_key is None):
            raise KilnError("INVALID_ARGUMENT",
                            "tls_cert and tls_key go together: the client certificate and its key")
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(tls_ca, "tls_ca") if tls_ca else None,
            private_key=_read(tls_key, "tls_key") if tls_key else None,
            certificate_chain=_read(tls_cert, "tls_cert") if tls_cert else None)
        if tls_server_name:
            options.append(("grpc.ssl_target_name_override", tls_server_name))
        channel = grpc.secure_channel(address, credentials, options=options)
    else:
        channel = grpc.insecure_channel(address, options=options)
    try:
        grpc.channel_ready_future(channel).result(timeout=connect_timeout)
    except grpc.FutureTimeoutError:
        channel.close()
        mode = "TLS" if tls else "plaintext"
        raise KilnError(
            "UNAVAILABLE",
            f"cannot reach kilnd at {address} within {connect_timeout:g}s over {mode} (is kilnd "
            "running? does it serve TLS (pass tls_ca=) or plaintext (pass no tls_*)?)") from None
    return channel


def call_metadata(token):
    """The metadata every call carries: the bearer token, as kilnd's auth expects it."""
    return (("authorization", f"Bearer {token}"),) if token else ()
