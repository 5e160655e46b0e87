"""infeed: the Python client of the infeedd daemon.

- :func:`feed` streams the batches of any loader (an iterable of dicts or tuples, a PyTorch
  ``DataLoader``, a ``tf.data.Dataset``) to the daemon: resume, several steps a message, the
  shared-memory pool, the last partial batch. :class:`Worker` and :func:`feed_workers` split the
  data between several loader workers (:mod:`infeed.workers`).
- :class:`Producer` streams batches of numpy arrays to the daemon (ingest protocol version 1,
  ``docs/protocol.md``); :mod:`infeed.convert` says how tensors are converted.
- :class:`Subscriber` receives the JSON summaries the daemon publishes (``docs/summaries.md``).
- :mod:`infeed.protocol` holds the wire constants and pack/unpack helpers.
- :mod:`infeed.checkpoint` loads the daemon's checkpoints into numpy (``infeed.checkpoint.load``);
  :mod:`infeed.export` writes their parameters as ``.npz`` and safetensors.
- :mod:`infeed.keys` reads the CURVE key files of ``infeedd keygen`` (both classes take
  ``server_key=``/``server_key_file=`` and ``keypair=``/``key_file=``).
"""

from . import adapters, checkpoint, convert, keys, protocol
from .errors import CheckpointError, InfeedError, RunEnded, RunFailed, ShmError
from .feed import FeedResult, feed
from .producer import Producer
from .subscriber import Subscriber, format_summary, host_call
from .workers import Worker, feed_workers, workers

__version__ = "0.1.0"

__all__ = ["Producer", "Subscriber", "format_summary", "host_call", "feed", "FeedResult",
           "Worker", "workers", "feed_workers", "InfeedError", "RunEnded", "RunFailed", "ShmError",
           "CheckpointError", "adapters", "checkpoint", "convert", "keys", "protocol",
           "__version__"]
