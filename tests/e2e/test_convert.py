"""What the Python client converts, and what it refuses (infeed.convert; the client's README):
lossless conversions happen, lossy ones only with round_floats=True and a sentence that says so,
batches are matched by name or by schema position; PyTorch tensors without a copy. No daemon."""

import numpy as np
import pytest

from infeed import adapters
from infeed import protocol as P
from helpers import FakeDataset
from infeed.convert import as_array, convert, encode, item_rows, item_tensors

F32 = P.schema_entry("x", "float32", [])
I32 = P.schema_entry("y", "int32", [])
I64 = P.schema_entry("z", "int64", [])
U8 = P.schema_entry("u", "uint8", [])


@pytest.fixture
def nrng(rng):
    return np.random.default_rng(rng.randrange(1 << 30))


def test_lossless_dtypes_convert_exactly(nrng):
    n = int(nrng.integers(1, 50))
    cases = [  # (values, entry): every value representable in the entry's dtype
        (nrng.integers(0, 256, n).astype(np.uint8), F32),
        (nrng.integers(0, 256, n).astype(np.uint8), I32),
        (nrng.integers(-2**31, 2**31, n).astype(np.int32), I64),
        (nrng.standard_normal(n).astype(np.float16), F32),
        (nrng.integers(0, 2, n).astype(bool), F32),
        (nrng.integers(-2**24, 2**24 + 1, n).astype(np.int64), F32),  # exact in float32
        (nrng.integers(-2**31, 2**31, n).astype(np.int64), I32),  # labels of a torch loader
        (nrng.integers(0, 256, n).astype(np.int64), U8),
        (nrng.integers(-1000, 1000, n).astype(np.float32), I32),  # whole numbers
        (nrng.integers(0, 2**31, n).astype(np.uint32), I64),
    ]
    for values, entry in cases:
        got = convert(entry["name"], values, entry)
        want = np.dtype(P.DTYPES[entry["dtype"]])
        assert got.dtype == want and got.flags.c_contiguous, (values.dtype, entry)
        assert np.array_equal(got.astype(np.float64), values.astype(np.float64)), \
            (values.dtype, entry, values, got)


def test_same_dtype_is_not_copied_unless_the_layout_needs_it(nrng):
    rows, d = int(nrng.integers(2, 9)), int(nrng.integers(2, 9))
    e = P.schema_entry("x", "float32", [d])
    a = nrng.standard_normal((rows, d)).astype(np.float32)
    assert convert("x", a, e) is a
    for odd in (np.asfortranarray(a), a.astype(">f4"), np.repeat(a, 2, axis=0)[::2]):
        got = convert("x", odd, e)
        assert got.flags.c_contiguous and got.dtype == np.dtype("<f4")
        assert np.array_equal(got, a)


def test_lossy_conversions_are_refused_with_a_sentence(nrng):
    n = int(nrng.integers(2, 20))
    x64 = nrng.standard_normal(n)
    with pytest.raises(TypeError, match=r"tensor 'x': expected dtype float32, got float64: "
                                        r"converting rounds .* round_floats=True"):
        convert("x", x64, F32)
    got = convert("x", x64, F32, round_floats=True)  # the option rounds to nearest
    assert got.dtype == np.float32 and np.array_equal(got, x64.astype(np.float32))
    big = nrng.integers(2**24 + 1, 2**40, n)
    with pytest.raises(TypeError, match=r"tensor 'x': expected dtype float32, got int64 .*beyond "
                                        r"2\*\*24.*round_floats=True"):
        convert("x", big, F32)
    assert np.array_equal(convert("x", big, F32, round_floats=True), big.astype(np.float32))
    labels = nrng.integers(0, 10, n)
    labels[int(nrng.integers(0, n))] = -(2**31) - 1
    # values never change, whatever the option: labels out of range, fractions into integers
    for opt in (False, True):
        with pytest.raises(TypeError, match=r"tensor 'y': expected dtype int32, got int64 holding "
                                            r"values from -2147483649 to \d+, which do not fit "
                                            r"int32 \(-2147483648 to 2147483647\)"):
            convert("y", labels, I32, round_floats=opt)
        with pytest.raises(TypeError, match=r"tensor 'u': expected dtype uint8, got int16 holding "
                                            r"values from -1"):
            convert("u", np.array([-1, 3], np.int16), U8, round_floats=opt)
        with pytest.raises(TypeError, match="tensor 'y': expected dtype int32, got float32 "
                                            "holding values that are not whole numbers"):
            convert("y", np.array([1.0, 2.5], np.float32), I32, round_floats=opt)
        with pytest.raises(TypeError, match="not whole numbers"):
            convert("y", np.array([1.0, np.nan]), I32, round_floats=opt)
        with pytest.raises(TypeError, match="tensor 'x': expected dtype float32, got complex128, "
                                            "which does not convert to a number"):
            convert("x", np.ones(3, np.complex128), F32, round_floats=opt)


def test_python_values_convert_by_their_values(nrng):
    vals = nrng.standard_normal(int(nrng.integers(1, 9))).tolist()
    got = convert("x", vals, F32)  # Python floats round as float32 literals would
    assert np.array_equal(got, np.array(vals, np.float32))
    ints = nrng.integers(0, 100, 5).tolist()
    assert np.array_equal(convert("y", ints, I32), np.array(ints, np.int32))
    with pytest.raises(TypeError, match="not whole numbers"):
        convert("y", [0.5, 1.0], I32)
    with pytest.raises(TypeError, match="do not fit"):
        convert("y", [2**40], I32)


def test_batches_by_name_in_any_order_or_by_position(nrng):
    rows, d = int(nrng.integers(1, 9)), int(nrng.integers(1, 9))
    schema = [P.schema_entry("x", "float32", [d]), P.schema_entry("y", "int32", [])]
    x = nrng.standard_normal((rows, d)).astype(np.float32)
    y = nrng.integers(0, 5, rows)
    for batch in ({"y": y, "x": x}, {"x": x, "y": y}, (x, y), [x, y]):
        frames, n = encode(batch, schema)
        assert n == rows and np.array_equal(frames[0], x) and frames[1].dtype == np.int32
        assert np.array_equal(frames[1], y)
    with pytest.raises(ValueError, match=r"a tuple of 3 tensors, the schema has 2 \(x, y\): a "
                                         r"tuple or list gives the tensors in schema order"):
        encode((x, y, y), schema)
    with pytest.raises(ValueError, match="missing 'y'"):
        encode({"x": x}, schema)
    with pytest.raises(ValueError, match=rf"tensor 'y': {rows + 1} rows, but 'x' has {rows}"):
        encode((x, np.zeros(rows + 1, np.int32)), schema)
    with pytest.raises(TypeError, match=r"expected a dict of tensors by name or a tuple in "
                                        r"schema order \(x, y\), got ndarray"):
        encode(x, schema)
    # a schema of one tensor takes the tensor alone
    assert item_tensors(x, ["x"])["x"] is x
    assert item_rows({"y": y, "x": x}) == rows and item_rows((x, y)) == rows


def test_tf_datasets_are_read_as_numpy(nrng):
    items = [(nrng.standard_normal((3, 2)), nrng.integers(0, 3, 3)) for _ in range(4)]
    assert list(adapters.batches(FakeDataset(items))) == items
    assert list(adapters.batches(iter(items))) == items


def test_torch_tensors_without_a_copy(nrng):
    torch = pytest.importorskip("torch")
    rows, d = int(nrng.integers(1, 9)), int(nrng.integers(1, 9))
    x = torch.from_numpy(nrng.standard_normal((rows, d)).astype(np.float32))
    a, from_python = as_array(x)
    assert not from_python and np.shares_memory(a, x.numpy())  # a CPU tensor: its memory
    e = P.schema_entry("x", "float32", [d])
    assert np.shares_memory(convert("x", x, e), x.numpy())
    w = x.clone().requires_grad_(True)  # detached, still no copy
    assert np.array_equal(convert("x", w, e), x.numpy())
    bf = x.to(torch.bfloat16)  # numpy has no bfloat16: float32 holds it exactly
    assert np.array_equal(convert("x", bf, e), bf.float().numpy())
    labels = torch.randint(0, 10, (rows,))  # int64, as torch makes labels
    got = convert("y", labels, I32)
    assert got.dtype == np.int32 and np.array_equal(got, labels.numpy())
    with pytest.raises(TypeError, match="tensor 'x': expected dtype float32, got float64"):
        convert("x", x.double(), e)
    items = list(adapters.from_torch([(x, labels), {"x": x}]))
    assert np.shares_memory(items[0][0], x.numpy()) and items[0][1].dtype == np.int64
    assert np.shares_memory(items[1]["x"], x.numpy())


def test_tensorflow_tensors_are_read_as_numpy(nrng):
    tf = pytest.importorskip("tensorflow")
    x = nrng.standard_normal((3, 2)).astype(np.float32)
    got = convert("x", tf.constant(x), P.schema_entry("x", "float32", [2]))
    assert np.array_equal(got, x)
    labels = tf.constant(nrng.integers(0, 9, 3))  # int64
    assert convert("y", labels, I32).dtype == np.int32
