"""Start-up checks that must pass before the server touches anything: the model and workflow
stores, the TLS files, and the three listening sockets.

``torchbay serve`` runs these first, before it spawns a worker, writes the key file or logs a
line, so a start that cannot succeed (a port in use, a missing store, an unreadable key) fails
with one sentence and leaves a server already running on that port, and its key file, alone.
Each failure is a ``TorchbayError`` whose message names the listener or file. Light imports only
(the CLI calls this before importing the server).
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import ssl

from torchbay.server.config.settings import ServerConfig, parse_address
from torchbay.server.errors import TorchbayError
from torchbay.server.http.combined import same_address

LISTENERS = ("inference", "management", "metrics")


def preflight(config: ServerConfig) -> None:
    """Raise TorchbayError when the model store, the workflow store (TorchServe's launcher:
    ``--workflow-store directory not found``) or the TLS files cannot be used."""
    for noun, store in (("model", config.model_store), ("workflow", config.workflow_store)):
        if store is not None and not store.is_dir():
            what = "is not a folder" if store.exists() else "does not exist"
            raise TorchbayError(f"{noun} store {store} {what}")
    check_tls(config)


def check_tls(config: ServerConfig) -> None:
    """Load the certificate and key as the listeners will, if any address is https:// or
    ``enable_grpc_ssl`` is on."""
    tls = any(parse_address(getattr(config, f"{n}_address")).tls for n in LISTENERS)
    if not tls and not config.enable_grpc_ssl:
        return
    cert, key = config.certificate_file, config.private_key_file
    for path in (cert, key):
        try:
            with open(str(path), "rb"):
                pass
        except OSError as exc:
            raise TorchbayError(f"cannot read TLS file {path}: {_reason(exc)}") from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        # No password: OpenSSL would prompt for one on the terminal (a start that waits for
        # typing, or two prompts and then 'not a PEM certificate' without a terminal).
        context.load_cert_chain(str(cert), str(key), password=_encrypted)
    except _EncryptedKey:
        raise TorchbayError(
            f"TLS key {key} is encrypted: private_key_file must be an unencrypted PEM key "
            "(e.g. openssl pkey -in KEY -out PLAIN_KEY)"
        ) from None
    except (ssl.SSLError, OSError) as exc:
        reason = getattr(exc, "reason", None)
        detail = f" ({reason.lower().replace('_', ' ')})" if reason else ""
        raise TorchbayError(
            f"cannot use TLS certificate {cert} with key {key}: not a PEM certificate and its "
            f"private key{detail}"
        ) from None


class _EncryptedKey(Exception):
    """The private key asks for a password."""


def _encrypted() -> bytes:
    raise _EncryptedKey


def listener_names(config: ServerConfig) -> tuple[str, ...]:
    """The listeners to bind: management shares the inference socket when both name one fixed
    address (TorchServe's ``ConnectorType.BOTH``, KServe's config); see server.combined. No
    metrics listener with ``enable_metrics_api`` false."""
    skip = {"metrics"} if not config.enable_metrics_api else set()
    if same_address(config.inference_address, config.management_address):
        skip.add("management")
    return tuple(name for name in LISTENERS if name not in skip)


def bind_listeners(config: ServerConfig) -> dict[str, socket.socket]:
    """Bind and listen on the addresses (port 0: any free port), all or none."""
    bound: dict[str, socket.socket] = {}
    try:
        for name in listener_names(config):
            bound[name] = _bind(name, getattr(config, f"{name}_address"))
        check_grpc_ports(config)
    except BaseException:
        close_all(bound)
        raise
    return bound


def check_grpc_ports(config: ServerConfig) -> None:
    """Fail now, with one line, when a fixed gRPC port is taken (the gRPC server binds its own
    sockets later, in serve.startup, and says the same if it is taken by then)."""
    seen = set()
    for name in ("inference", "management"):
        host, port = getattr(config, f"grpc_{name}_address"), getattr(config, f"grpc_{name}_port")
        if port and (host, port) not in seen:
            seen.add((host, port))
            _bind(f"gRPC {name}", f"http://{f'[{host}]' if ':' in host else host}:{port}").close()


def close_all(sockets: dict[str, socket.socket]) -> None:
    for sock in sockets.values():
        with contextlib.suppress(OSError):
            sock.close()
    sockets.clear()


def _bind(name: str, address: str) -> socket.socket:
    parsed = parse_address(address)
    family = socket.AF_INET6 if ":" in parsed.host else socket.AF_INET
    where = f"[{parsed.host}]" if family == socket.AF_INET6 else parsed.host
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((parsed.host, parsed.port))
        sock.listen(2048)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise TorchbayError(
            f"cannot listen on {where}:{parsed.port} ({name}): {_reason(exc)}"
        ) from None
    return sock


def _reason(exc: OSError) -> str:
    """``address already in use``: the OS's words, lower-cased, without the errno."""
    if exc.errno is not None and exc.errno in errno.errorcode:
        text = os.strerror(exc.errno)
    else:
        text = exc.strerror or str(exc)
    return text[:1].lower() + text[1:]
