"""Batches from the loaders users come with, as :func:`infeed.feed` and ``Producer.send`` take
them. Neither PyTorch nor TensorFlow is imported here: their objects are recognised by what they
have.

- Any iterable of batches: each a dict of tensors by name, a tuple (or list) of tensors in the
  schema's order, or, for a schema of one tensor, that tensor alone.
- A ``torch.utils.data.DataLoader`` is such an iterable (its default collate gives a list
  ``[x, y]`` for a dataset of ``(x, y)`` samples, or a dict): its CPU tensors are read where
  they are (``.numpy()``, no copy; a tensor on a GPU is copied to the CPU first).
- A ``tf.data.Dataset`` is read with ``as_numpy_iterator()`` (:func:`from_tf`), which gives
  numpy arrays (tuples or dicts of them, as the dataset's elements are).
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping

from .convert import as_array


def batches(data: Any) -> Iterator[Any]:
    """The batches of ``data``: ``data.as_numpy_iterator()`` for a ``tf.data.Dataset``, else
    ``iter(data)``."""
    if hasattr(data, "as_numpy_iterator") and callable(data.as_numpy_iterator):
        return from_tf(data)
    return iter(data)


def from_tf(dataset: Any) -> Iterator[Any]:
    """The elements of a ``tf.data.Dataset`` as numpy arrays (``as_numpy_iterator``): batch it
    first (``dataset.batch(n)``) so that each element is a batch."""
    return iter(dataset.as_numpy_iterator())


def from_torch(loader: Iterable[Any]) -> Iterator[Any]:
    """The batches of a ``torch.utils.data.DataLoader`` (or any iterable of tensors) with every
    tensor as a numpy array: the tensor's own memory where it is a CPU tensor numpy can read
    (no copy), else a copy on the CPU. :func:`infeed.feed` and ``Producer.send`` do this
    themselves; this is for code that wants the arrays."""
    for item in loader:
        if isinstance(item, Mapping):
            yield {k: as_array(v)[0] for k, v in item.items()}
        elif isinstance(item, (tuple, list)):
            yield tuple(as_array(v)[0] for v in item)
        else:
            yield as_array(item)[0]
