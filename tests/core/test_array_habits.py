"""What a NumPy or jax user tries first on an ifrtpy array, on every backend: ``print(a)``
and ``repr(a)`` show the values as NumPy does (summarised, from the shards that hold the
printed elements, never all of a large array), ``a.devices()``, ``ifrt.devices()``, and
NumPy's operations (``a + 1``, ``a[0]``, ``a.sum()``, ``len(a)``) refused with what ifrtpy
arrays are and what to do instead."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ifrtpy as ifrt
from ifrtpy import array as array_module
from ifrtpy import array_text
from ifrtpy.array import ArraySpec
from ifrtpy.errors import InternalError
from ifrtpy.sharding import ShardingParam, ShardingParamSharding
from ifrtpy.testing.example_backend import ExampleArray, create_client

BACKENDS = ["pjrt", "reference", "jax"]


@pytest.fixture(scope="module")
def clients():
    made = {}

    def get(backend):
        if backend not in made:
            made[backend] = ifrt.get_client(
                backend, **({} if backend == "jax" else {"device_count": 8}))
        return made[backend]

    return get


def rows(client, n=8):
    """A sharding of an array's rows over the client's first ``n`` devices."""
    mesh = ifrt.Mesh(np.array(client.devices()[:n]), ("x",))
    return ifrt.NamedSharding(mesh, ifrt.PartitionSpec("x"))


def one_line(text):
    return " ".join(text.split())


def numpy_body(a, x):
    """The values part of ``repr(a)`` as NumPy writes it for ``x``."""
    return np.array2string(x, separator=", ", prefix=f"{type(a).__name__}(", suffix=",")


# -- print and repr ------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_repr_shows_values_dtype_and_sharding(backend, clients):
    client = clients(backend)
    x = np.arange(4, dtype=np.float32)
    a = ifrt.device_put(x, client.devices()[0])
    name = type(a).__name__
    assert repr(a) == (f"{name}([0., 1., 2., 3.], dtype=float32,\n{' ' * (len(name) + 1)}"
                       f"sharding={a.sharding!r})")
    assert str(a) == str(x) == "[0. 1. 2. 3.]"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("x", [
    np.arange(32, dtype=np.float32).reshape(8, 4) / 3,
    np.arange(-8, 8, dtype=np.int8),
    np.array([True, False] * 4),
    np.linspace(-2, 2, 8).astype(ifrt.DType(ifrt.DType.Kind.BF16)),
    np.arange(8, dtype=np.complex64) * 1j,
], ids=["f32", "s8", "pred", "bf16", "c64"])
def test_print_of_a_sharded_array_is_numpys(backend, clients, x):
    a = clients(backend).make_array_from_host_buffer(x, rows(clients(backend)))
    assert str(a) == str(x)
    text = repr(a)
    assert text.startswith(f"{type(a).__name__}({numpy_body(a, x)}")
    assert f"dtype={x.dtype.name}" in text and f"sharding={a.sharding!r})" in text


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_large_array_prints_summarised_with_its_shape(backend, clients):
    x = np.arange(64 * 40, dtype=np.float32).reshape(64, 40)
    a = clients(backend).make_array_from_host_buffer(x, rows(clients(backend)))
    assert str(a) == str(x) and "..." in str(a)
    assert numpy_body(a, x) in repr(a) and "shape=(64, 40)" in repr(a)


@settings(max_examples=60, deadline=None)
@given(dims=st.lists(st.integers(0, 9), min_size=0, max_size=3),
       threshold=st.integers(0, 60), edgeitems=st.integers(0, 4), split=st.sampled_from([1, 2, 4]))
def test_print_is_numpys_for_any_shape_threshold_and_sharding(dims, threshold, edgeitems, split):
    """The law: ``str(a) == str(x)`` and the values of ``repr(a)`` are NumPy's, whatever
    NumPy's print options, also when only the elements printed are read."""
    client = _EXAMPLE
    if not dims or dims[0] % split:
        split = 1
    x = (np.arange(int(np.prod(dims)), dtype=np.float32) * 1.5).reshape(dims)
    param = ShardingParam([split] + [1] * (len(dims) - 1), [0], [split]) if dims else \
        ShardingParam([], [0], [1])
    a = client.make_array_from_host_buffer(
        x, ShardingParamSharding(param, client.devices()[:split]))
    with np.printoptions(threshold=threshold, edgeitems=edgeitems):
        assert str(a) == str(x)
        assert numpy_body(a, x) in repr(a)
        assert ("shape=" in repr(a)) == (x.size > threshold or (x.size == 0 and x.shape != (0,)))


_EXAMPLE = create_client(device_count=4)


@pytest.mark.parametrize("backend", ["pjrt", "reference"])
def test_a_summarised_repr_in_host_memory_copies_only_what_it_prints(backend, clients, monkeypatch):
    """Arrays in memory the host reads are viewed: no copy of the array, of any shard."""
    client = clients(backend)
    x = np.arange(1024 * 1024, dtype=np.float32).reshape(1024, 1024)
    a = client.make_array_from_host_buffer(x, rows(client))
    whole = ifrt.device_put(x, client.devices()[0])

    def refused(*args, **kwargs):
        raise AssertionError("repr copied a whole array")

    monkeypatch.setattr(type(a), "copy_to_host_buffer", refused)
    for array in (a, whole):
        assert str(array) == str(x)
        assert numpy_body(array, x) in repr(array)


def test_a_summarised_repr_reads_only_the_shards_that_hold_printed_elements(monkeypatch):
    """Where shards are copied (no view), only those holding an edge element are."""
    read = []
    original = ExampleArray.copy_to_host_buffer

    def recording(self, *args, **kwargs):
        read.append([d.id for d in self.sharding.devices])
        return original(self, *args, **kwargs)

    x = np.arange(400 * 30, dtype=np.int32).reshape(400, 30)
    a = _EXAMPLE.make_array_from_host_buffer(
        x, ShardingParamSharding(ShardingParam([4, 1], [0], [4]), _EXAMPLE.devices()))
    monkeypatch.setattr(ExampleArray, "copy_to_host_buffer", recording)
    assert str(a) == str(x)
    assert sorted(read) == [[0], [3]]


def test_a_repr_copies_at_most_its_byte_limit_and_says_so(monkeypatch):
    x = np.arange(400 * 30, dtype=np.float32).reshape(400, 30)
    a = _EXAMPLE.make_array_from_host_buffer(
        x, ShardingParamSharding(ShardingParam([4, 1], [0], [4]), _EXAMPLE.devices()))
    monkeypatch.setattr(array_text, "REPR_COPY_BYTES", 2 * x.nbytes // 4 - 1)
    monkeypatch.setattr(ExampleArray, "copy_to_host_buffer", None)  # any call fails
    text = repr(a)
    assert text.startswith(
        f"ExampleArray(<values not read: printing them would copy 2 shards ({x.nbytes // 2} "
        f"bytes) the host cannot view, more than the {x.nbytes // 2 - 1} bytes a repr copies; "
        "np.asarray(a) copies the whole array>,")
    assert "shape=(400, 30), dtype=float32,\n             sharding=" in text
    assert str(a) == text


@pytest.mark.parametrize("backend", BACKENDS)
def test_deleted_donated_and_error_arrays_say_so_without_a_transfer(backend, clients, monkeypatch):
    client = clients(backend)
    device = client.devices()[0]
    deleted = ifrt.device_put(np.zeros(4, np.float32), device)
    deleted.delete()
    donating = client.compile(ifrt.HloProgram(
        """func.func public @main(%x: tensor<4xf32> {jax.buffer_donor = true}) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}"""), ifrt.CompileOptions(devices=[device]))
    donated = ifrt.device_put(np.zeros(4, np.float32), device)
    donating(donated)
    failed, = client.make_error_arrays(
        InternalError("injected error"),
        [ArraySpec(np.float32, (4,), ifrt.SingleDeviceSharding(device))])
    monkeypatch.setattr(type(failed), "copy_to_host_buffer", None)
    monkeypatch.setattr(type(failed), "__array__", None)
    name = type(failed).__name__
    for a, why in [(deleted, "deleted or donated"), (donated, "deleted or donated"),
                   (failed, "error: InternalError: injected error")]:
        assert one_line(repr(a)) == one_line(
            f"{name}(<{why}>, shape=(4,), dtype=float32, sharding={a.sharding!r})")
        assert str(a) == repr(a)


def test_an_array_on_devices_of_other_processes_says_so(monkeypatch):
    client = ifrt.get_client("reference", device_count=4, addressable_device_count=2)
    a = client.make_array_from_host_buffer(np.arange(8, dtype=np.float32), rows(client, 4))
    monkeypatch.setattr(type(a), "copy_to_host_buffer", None)
    monkeypatch.setattr(type(a), "__array__", None)
    assert one_line(repr(a)).startswith(
        "ReferenceArray(<not fully addressable: this process holds 2 of its 4 shards>, "
        "shape=(8,), dtype=float32,")


def test_a_repr_never_raises(monkeypatch):
    a = _EXAMPLE.make_array_from_host_buffer(np.zeros(3, np.float32),
                                             ifrt.SingleDeviceSharding(_EXAMPLE.devices()[0]))

    def broken(*args, **kwargs):
        raise RuntimeError("the device went away")

    monkeypatch.setattr(ExampleArray, "copy_to_host_buffer", broken)
    assert repr(a).startswith("ExampleArray(<values not read: RuntimeError: the device went away>")


# -- jax's habits that fit a runtime layer --------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_devices_of_an_array_and_of_the_default_client(backend, clients):
    client = clients(backend)
    one = ifrt.device_put(np.zeros(4, np.float32), client.devices()[1])
    assert one.devices() == {client.devices()[1]}
    many = client.make_array_from_host_buffer(np.zeros(8, np.float32), rows(client))
    assert many.devices() == set(client.devices()[:8])
    assert ifrt.devices() == ifrt.get_client().devices()
    assert ifrt.devices("reference") == ifrt.get_client("reference").devices()


# -- NumPy's operations are refused with what to do instead ---------------------------------


NOT_HERE = [
    ("a + 1", lambda a: a + 1, TypeError, "unsupported operand type(s) for +"),
    ("1 + a", lambda a: 1 + a, TypeError, "unsupported operand type(s) for +"),
    ("a * a", lambda a: a * a, TypeError, "unsupported operand type(s) for *"),
    ("a @ a", lambda a: a @ a, TypeError, "unsupported operand type(s) for @"),
    ("a ** 2", lambda a: a ** 2, TypeError, "unsupported operand type(s) for **"),
    ("a < 1", lambda a: a < 1, TypeError, "'<' not supported"),
    ("a == 1", lambda a: a == 1, TypeError, "'==' not supported"),
    ("a != a", lambda a: a != a, TypeError, "'!=' not supported"),
    ("a == a", lambda a: a == a, TypeError, "'==' not supported"),
    ("a == x", lambda a: a == np.arange(4), TypeError, "'==' not supported"),
    ("x == a", lambda a: np.arange(4) == a, TypeError, "'==' not supported"),
    ("x >= a", lambda a: np.arange(4) >= a, TypeError, "'>=' not supported"),
    ("bool(a)", bool, TypeError, "the truth value of a"),
    ("if a", lambda a: 1 if a else 0, TypeError, "the truth value of a"),
    ("-a", lambda a: -a, TypeError, "bad operand type for unary -"),
    ("a[0]", lambda a: a[0], TypeError, "object is not subscriptable"),
    ("a[0] = 1", lambda a: a.__setitem__(0, 1), TypeError, "does not support item assignment"),
    ("len(a)", len, TypeError, "has no len()"),
    ("list(a)", list, TypeError, "object is not iterable"),
    ("float(a)", float, TypeError, "float() argument"),
    ("a.sum()", lambda a: a.sum(), AttributeError, "has no attribute 'sum'"),
    ("a.reshape(2, 2)", lambda a: a.reshape(2, 2), AttributeError, "has no attribute 'reshape'"),
    ("a.astype", lambda a: a.astype, AttributeError, "has no attribute 'astype'"),
    ("a.T", lambda a: a.T, AttributeError, "has no attribute 'T'"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("what, call, error, start", NOT_HERE, ids=[n[0] for n in NOT_HERE])
def test_numpy_habits_say_what_ifrtpy_arrays_are_and_what_to_do(backend, clients, what, call,
                                                                 error, start):
    a = ifrt.device_put(np.arange(4, dtype=np.float32), clients(backend).devices()[0])
    with pytest.raises(error) as info:
        call(a)
    message = str(info.value)
    first = message.split(". ")[0]  # Python's own words for it, then what ifrtpy arrays are
    assert start in first and repr(type(a).__name__) in first, message
    for text in ("runtime buffers on devices, not a NumPy or jax array library",
                 "compile a program", "docs/programs.md", "np.asarray(a)", "ifrt.to_jax(a)"):
        assert text in message, (text, message)


def test_attribute_messages_give_the_same_call_on_numpy_and_jax(clients):
    a = ifrt.device_put(np.arange(4, dtype=np.float32), clients("pjrt").devices()[0])
    with pytest.raises(AttributeError) as info:
        a.sum()
    assert "np.asarray(a).sum(...)" in str(info.value) and "ifrt.to_jax(a).sum(...)" in str(info.value)
    with pytest.raises(AttributeError) as info:
        a.T
    assert "np.asarray(a).T" in str(info.value) and "np.asarray(a).T()" not in str(info.value)


def test_what_still_works_as_before(clients):
    """The refusals change no protocol: NumPy still reads the array, hasattr stays false,
    an array hashes by identity (a dict key, a set member, found in a list as itself),
    NumPy's functions other than comparisons take it through NumPy."""
    a = ifrt.device_put(np.arange(4, dtype=np.float32), clients("pjrt").devices()[0])
    np.testing.assert_array_equal(np.asarray(a), np.arange(4))
    assert np.sum(a) == 6 and np.array([a, a]).shape == (2, 4)
    np.testing.assert_array_equal(np.add(a, 1), np.arange(1, 5))
    assert not hasattr(a, "sum") and not hasattr(a, "__array_interface__")
    assert a in [a] and {a: 1}[a] == 1 and a in {a} and hash(a) == object.__hash__(a)
    assert "sum" not in dir(a) and "shape" in dir(a) and "devices" in dir(a)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_array_is_never_compared_nor_truth_tested_silently(backend, clients):
    """No comparison or truth test answers what NumPy or jax would not: identity
    (``a == a`` true, ``a == 1`` false), an array's truth, or NumPy's elementwise answer
    through ``__array__``; each raises the refusal ``a < 1`` raises."""
    a = ifrt.device_put(np.arange(4, dtype=np.float32), clients(backend).devices()[0])
    x = np.arange(4, dtype=np.float32)
    for compare in (lambda: a == a, lambda: a != 1, lambda: a == x, lambda: x == a,
                    lambda: x != a, lambda: x < a, lambda: bool(a), lambda: not a):
        with pytest.raises(TypeError, match="not a NumPy or jax array library"):
            compare()


def test_help_of_array_shows_what_it_does_not_its_refusals():
    """``help(ifrt.Array)`` lists the methods and properties of an array, none of the
    refusals of NumPy's habits (``__add__``, ``T``, ``sum``), which ``dir`` hides too."""
    import pydoc

    text = pydoc.render_doc(ifrt.Array, renderer=pydoc.plaintext)
    listed = {line[4:].split("(")[0].strip() for line in text.splitlines()
              if line.startswith(" |  ") and line[4:5] not in (" ", "")}
    assert {"copy_to_host_buffer", "devices", "block_until_ready", "shape", "sharding",
            "dtype", "addressable_shards", "__array__", "__repr__"} <= listed
    for refused in ("__add__", "__radd__", "__lt__", "__eq__", "__bool__", "__getitem__",
                    "__len__", "T", "sum", "reshape", "astype", "__array_ufunc__"):
        assert refused not in listed, refused
        assert refused not in dir(ifrt.Array)
    assert "refuse(self" not in text
    assert len(text.splitlines()) < 200


def test_an_error_message_naming_an_array_reads_none_of_its_data(monkeypatch):
    a = _EXAMPLE.make_array_from_host_buffer(np.zeros(3, np.float32),
                                             ifrt.SingleDeviceSharding(_EXAMPLE.devices()[0]))
    monkeypatch.setattr(ExampleArray, "copy_to_host_buffer", None)  # any read fails
    with pytest.raises(ifrt.errors.InvalidArgumentError,
                       match=r"args must be a sequence of Arrays, got ExampleArray\(dtype=f32, "):
        array_module.array_sequence(a, "args")


# -- an execute's outputs ------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_numpy_refuses_an_executes_list_of_outputs_and_says_take_the_output(backend, clients):
    client = clients(backend)
    b = ifrt.builder.Builder("double")
    v = b.parameter((4,), np.float32)
    exe = client.compile(b.build(v + v))
    x = np.arange(4, dtype=np.float32)
    a = ifrt.device_put(x, client.devices()[0])
    for outs in (exe(a), exe(a), exe.execute([a]).outputs):   # first, repeated, execute
        assert isinstance(outs, list) and len(outs) == 1       # IFRT's contract: a list
        with pytest.raises(TypeError, match=r"out, = exe\(a\)"):
            np.asarray(outs)                                   # was shape (1, 4), silently
        np.testing.assert_array_equal(np.stack(outs), [x * 2])  # stacking, said so, works
        out, = outs
        np.testing.assert_array_equal(np.asarray(out), x * 2)
