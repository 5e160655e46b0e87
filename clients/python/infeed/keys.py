"""CURVE keys for talking to an infeedd that runs with ``--curve-secret-key``.

Key files are those ``infeedd keygen PREFIX`` writes (docs/protocol.md, "Key files"):

- ``PREFIX.key``: the key pair, mode 0600; ``#`` comment lines, then ``public-key Z85`` and
  ``secret-key Z85``.
- ``PREFIX.pub``: the public key alone on a line.

Keys are 40-character Z85 strings. :class:`~infeed.Producer` and :class:`~infeed.Subscriber`
take ``server_key=`` (the daemon's public key, Z85) or ``server_key_file=`` (its ``.pub``), and
``keypair=(public, secret)`` or ``key_file=`` (the client's own ``.key``).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any, Optional, Tuple, Union

import zmq
import zmq.utils.z85

Z85_LEN = 40
_Z85 = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#")

PathLike = Union[str, "os.PathLike[str]"]


def _text(key: Any, what: str) -> str:
    if isinstance(key, (bytes, bytearray)):
        try:
            key = bytes(key).decode("ascii")
        except UnicodeDecodeError:
            raise ValueError(f"{what}: expected a key of {Z85_LEN} Z85 characters, got bytes "
                             f"that are not ASCII") from None
    if not isinstance(key, str):
        raise TypeError(f"{what}: expected a Z85 key (str or bytes), got {type(key).__name__}")
    return key


def check_z85(key: Any, what: str = "key") -> str:
    """The key as a str after checking it is 40 Z85 characters that decode (each 5-character
    group at most 2^32 - 1); ValueError naming ``what`` otherwise."""
    key = _text(key, what)
    if len(key) != Z85_LEN or not set(key) <= _Z85:
        raise ValueError(f"{what}: expected a key of {Z85_LEN} Z85 characters, got "
                         f"{len(key)} characters" +
                         ("" if len(key) != Z85_LEN else " outside the Z85 alphabet"))
    try:
        zmq.utils.z85.decode(key)
    except (ValueError, OverflowError, KeyError, struct.error):
        raise ValueError(f"{what}: expected a Z85 key, got 40 characters that do not decode") \
            from None
    return key


def _lines(path: PathLike, what: str):
    try:
        text = Path(path).read_text(encoding="ascii")
    except UnicodeDecodeError:
        raise ValueError(f"{what}: '{path}': expected a text file of Z85 keys") from None
    except OSError as e:
        raise ValueError(f"{what}: cannot open '{path}': {e.strerror or e}") from None
    for n, line in enumerate(text.split("\n"), 1):
        line = line.strip()
        if line and not line.startswith("#"):
            yield n, line


def load_keypair(path: PathLike) -> Tuple[str, str]:
    """``(public, secret)`` from a ``.key`` file of ``infeedd keygen``; ValueError naming the
    file and line when it is not one (or its public key is not the secret key's)."""
    what = "key_file"
    found: dict = {}
    for n, line in _lines(path, what):
        word, _, rest = line.partition(" ")
        if word not in ("public-key", "secret-key"):
            raise ValueError(f"{what}: '{path}', line {n}: expected 'public-key KEY' or "
                             f"'secret-key KEY' (a key pair file written by infeedd keygen), "
                             f"got a line starting {word[:12]!r}")
        if word in found:
            raise ValueError(f"{what}: '{path}', line {n}: a second {word} (the first is on line "
                             f"{found[word][0]})")
        found[word] = (n, check_z85(rest.strip(), f"{what}: '{path}', line {n}: {word}"))
    if len(found) != 2:
        raise ValueError(f"{what}: '{path}': expected a 'public-key' and a 'secret-key' line (a "
                         f"key pair file written by infeedd keygen)")
    public, secret = found["public-key"][1], found["secret-key"][1]
    if zmq.curve_public(secret.encode()).decode() != public:
        raise ValueError(f"{what}: '{path}', line {found['public-key'][0]}: public-key: expected "
                         f"the public key of the secret key on line {found['secret-key'][0]}")
    return public, secret


def load_public_key(path: PathLike, what: str = "server_key_file") -> str:
    """The key of a ``.pub`` file (one Z85 key line)."""
    key: Optional[str] = None
    for n, line in _lines(path, what):
        if line.startswith(("public-key", "secret-key")):
            raise ValueError(f"{what}: '{path}', line {n}: expected a public key file (PREFIX.pub "
                             f"of infeedd keygen), got a key pair file, which holds a secret key")
        if key is not None:
            raise ValueError(f"{what}: '{path}', line {n}: expected one key")
        key = check_z85(line, f"{what}: '{path}', line {n}")
    if key is None:
        raise ValueError(f"{what}: '{path}': expected a public key of 40 Z85 characters, got no "
                         f"key line")
    return key


def generate_keypair() -> Tuple[str, str]:
    """A fresh ``(public, secret)`` pair (``zmq.curve_keypair``), Z85 strings."""
    public, secret = zmq.curve_keypair()
    return public.decode(), secret.decode()


def client_keys(server_key: Any = None, server_key_file: Optional[PathLike] = None,
                keypair: Any = None, key_file: Optional[PathLike] = None
                ) -> Optional[Tuple[str, str, str]]:
    """``(server, public, secret)`` from a client's keyword arguments, or None when none is
    given (CURVE off). Exactly one of ``server_key``/``server_key_file`` and one of
    ``keypair``/``key_file`` are needed together."""
    if server_key is None and server_key_file is None and keypair is None and key_file is None:
        return None
    if (server_key is None) == (server_key_file is None):
        raise ValueError("server_key, server_key_file: expected exactly one (the daemon's public "
                         "key, or its .pub file), got " +
                         ("both" if server_key is not None else "neither"))
    if (keypair is None) == (key_file is None):
        raise ValueError("keypair, key_file: expected exactly one (this client's key pair, or "
                         "its .key file from infeedd keygen), got " +
                         ("both" if keypair is not None else "neither"))
    server = (check_z85(server_key, "server_key") if server_key is not None
              else load_public_key(server_key_file))
    if keypair is not None:
        if not isinstance(keypair, (tuple, list)) or len(keypair) != 2:
            raise ValueError("keypair: expected (public, secret), two Z85 keys")
        public = check_z85(keypair[0], "keypair: public")
        secret = check_z85(keypair[1], "keypair: secret")
        if zmq.curve_public(secret.encode()).decode() != public:
            raise ValueError("keypair: the public key is not the secret key's")
    else:
        public, secret = load_keypair(key_file)
    return server, public, secret


def apply_client(sock: zmq.Socket, keys: Optional[Tuple[str, str, str]]) -> None:
    """Makes ``sock`` a CURVE client of the daemon (before it connects); None: nothing."""
    if keys is None:
        return
    if not zmq.has("curve"):
        raise RuntimeError("CURVE keys were given, but this libzmq has no CURVE "
                           "(zmq.has('curve') is False)")
    server, public, secret = keys
    sock.setsockopt(zmq.CURVE_SERVERKEY, server.encode())
    sock.setsockopt(zmq.CURVE_PUBLICKEY, public.encode())
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret.encode())
