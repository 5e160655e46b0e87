"""infeed: the Python client of the infeedd daemon.

- :class:`Producer` streams batches of numpy arrays to the daemon (ingest protocol version 1,
  ``docs/protocol.md``).
- :class:`Subscriber` receives the JSON summaries the daemon publishes (``docs/summaries.md``).
- :mod:`infeed.protocol` holds the wire constants and pack/unpack helpers.
- :mod:`infeed.keys` reads the CURVE key files of ``infeedd keygen`` (both classes take
  ``server_key=``/``server_key_file=`` and ``keypair=``/``key_file=``).
"""

from . import keys, protocol
from .errors import InfeedError, RunEnded, ShmError
from .producer import Producer
from .subscriber import Subscriber, format_summary

__version__ = "0.1.0"

__all__ = ["Producer", "Subscriber", "format_summary", "InfeedError", "RunEnded", "ShmError", "keys", "protocol", "__version__"]
