"""Port of IFRT's sharding_test.cc: 6 devices of the example backend, the first 4
addressable."""

import pickle

import pytest

from ifrtpy.device import DeviceList, MemoryKind
from ifrtpy.errors import InvalidArgumentError
from ifrtpy.shape import BoundedDynamicShapeTag, DynamicShape, Index, IndexDomain, Shape
from ifrtpy.sharding import (
    ConcreteEvenSharding, ConcreteSharding, OpaqueSharding, Sharding, ShardingParam,
    ShardingParamSharding, SingleDeviceShardSemantics, SingleDeviceSharding,
)
from ifrtpy.testing.example_backend import create_client

ALL = SingleDeviceShardSemantics.ALL_SHARDS
ADDRESSABLE = SingleDeviceShardSemantics.ADDRESSABLE_SHARDS
CLIENT = create_client(6, addressable_device_count=4,
                       memory_kinds=("device", "pinned_host", "unpinned_host"))


def devs(*ids) -> DeviceList:
    return DeviceList(CLIENT.lookup_device(i) for i in ids)


def single(i) -> SingleDeviceSharding:
    return SingleDeviceSharding(CLIENT.lookup_device(i))


def dyn(*dims) -> DynamicShape:
    return DynamicShape(Shape(dims), BoundedDynamicShapeTag([True] * len(dims)))


def check_disassembled(disassembled, shapes, device_ids):
    assert [s for s, _ in disassembled] == list(shapes)
    assert [sh for _, sh in disassembled] == [single(i) for i in device_ids]
    assert all(type(sh) is SingleDeviceSharding for _, sh in disassembled)


def check_hash(*shardings):
    """Equal values hash equally; distinct ones differ; pickling keeps both."""
    for a in shardings:
        for b in shardings:
            if a == b:
                assert hash(a) == hash(b)
    assert len(set(shardings)) == len(shardings)


P23 = ShardingParam([2, 3], [1, 0], [3, 2])


def test_sharding_is_abstract():
    with pytest.raises(TypeError):
        Sharding(devs(0), MemoryKind(), False)


def test_memory_kind_is_canonicalized():
    assert single(0).memory_kind == MemoryKind("device")
    pinned = SingleDeviceSharding(CLIENT.lookup_device(0), "pinned_host")
    assert pinned.memory_kind == MemoryKind("pinned_host")
    assert pinned != single(0)
    assert SingleDeviceSharding(CLIENT.lookup_device(0), MemoryKind("device")) == single(0)


class TestSingleDeviceSharding:
    def test_create_with_bad_device(self):
        with pytest.raises(InvalidArgumentError):
            SingleDeviceSharding(None)

    def test_is_fully_replicated(self):
        assert single(0).is_fully_replicated

    def test_get_shard_shape(self):
        assert single(0).shard_shape(Shape([10, 20])) == Shape([10, 20])

    def test_has_same_partitioning(self):
        assert single(0).has_same_partitioning(single(0))
        assert single(0).has_same_partitioning(single(1))

    def test_with_device_assignment(self):
        assert single(0).with_device_assignment(devs(1)) == single(1)
        assert single(0).with_device_assignment(memory_kind="pinned_host").memory_kind == \
            MemoryKind("pinned_host")
        with pytest.raises(InvalidArgumentError, match="SingleDeviceSharding can only have one "
                           "device, but was asked to have 2 devices"):
            single(0).with_device_assignment(devs(0, 1))

    def test_index_domains(self):
        shape = Shape([10, 20])
        for args in [(), (ALL,), (ADDRESSABLE,)]:
            assert single(0).index_domains(shape, *args) == [IndexDomain(shape)]

    def test_index_domains_non_addressable(self):
        assert single(5).index_domains(Shape([10, 20]), ADDRESSABLE) == []
        assert single(5).index_domains(Shape([10, 20])) == [IndexDomain(Shape([10, 20]))]

    @pytest.mark.parametrize("shape", [Shape([10, 20]), dyn(10, 20)])
    def test_disassemble(self, shape):
        for args in [(), (ALL,), (ADDRESSABLE,)]:
            disassembled = single(0).disassemble(shape, *args)
            assert disassembled == [(shape, single(0))]

    def test_hash(self):
        check_hash(single(0), single(1))
        assert hash(single(0)) == hash(single(0))


class TestOpaqueSharding:
    def test_create_with_bad_device_list(self):
        with pytest.raises(InvalidArgumentError, match="non-empty device list"):
            OpaqueSharding(devs())

    def test_is_fully_replicated(self):
        assert not OpaqueSharding(devs(0, 1)).is_fully_replicated

    def test_get_shard_shape(self):
        with pytest.raises(InvalidArgumentError, match="OpaqueSharding does not have shard shape"):
            OpaqueSharding(devs(0, 1)).shard_shape(Shape([10, 20]))

    def test_has_same_partitioning(self):
        sharding0 = OpaqueSharding(devs(0, 1))
        assert sharding0.has_same_partitioning(sharding0)
        assert not sharding0.has_same_partitioning(OpaqueSharding(devs(0, 1)))

    def test_with_device_assignment(self):
        sharding0 = OpaqueSharding(devs(0, 1))
        new = sharding0.with_device_assignment(devs(2, 3))
        assert isinstance(new, OpaqueSharding) and new.devices == devs(2, 3)
        with pytest.raises(InvalidArgumentError, match="OpaqueSharding should have the same number "
                           "of devices as the current sharding, but was asked to have 4 devices"):
            sharding0.with_device_assignment(devs(0, 1, 2, 3))

    def test_failed_to_disassemble(self):
        sharding = OpaqueSharding(devs(0, 1))
        for shape in (Shape([30]), dyn(30)):
            with pytest.raises(InvalidArgumentError,
                               match="OpaqueSharding does not have shard shape information"):
                sharding.disassemble(shape)

    def test_index_domains_fails(self):
        with pytest.raises(InvalidArgumentError,
                           match="OpaqueSharding does not have index domain information"):
            OpaqueSharding(devs(0, 1)).index_domains(Shape([30]))

    def test_hash(self):
        check_hash(OpaqueSharding(devs(0, 1)), OpaqueSharding(devs(2, 3)))

    def test_pickle_keeps_devices_and_kind(self):
        sharding = OpaqueSharding(devs(0, 1), "pinned_host")
        copy = pickle.loads(pickle.dumps(sharding))
        assert copy.devices == sharding.devices and copy.memory_kind == sharding.memory_kind


def concrete(ids, shape, shard_shapes, index_domains=None):
    return ConcreteSharding(devs(*ids), shape, shard_shapes, index_domains)


class TestConcreteSharding:
    def test_create_with_bad_device_list(self):
        with pytest.raises(InvalidArgumentError, match="non-empty device list"):
            ConcreteSharding(devs(), Shape([]), [Shape([])])

    def test_mixed_static_and_dynamic_refused(self):
        with pytest.raises(InvalidArgumentError, match="all static or all dynamic"):
            concrete([0, 1], Shape([30]), [Shape([10]), dyn(20)])

    def test_is_fully_replicated(self):
        assert not concrete([0, 1], Shape([30]), [Shape([10]), Shape([20])]).is_fully_replicated

    def test_get_shard_shape_success(self):
        sharding = concrete([0, 1], Shape([30]), [Shape([30])] * 2)
        assert sharding.shard_shape(Shape([30])) == Shape([30])

    def test_get_shard_shape_failure(self):
        with pytest.raises(InvalidArgumentError,
                           match="ConcreteSharding does not have a fixed shard shape"):
            concrete([0, 1], Shape([30]), [Shape([10]), Shape([20])]).shard_shape(Shape([30]))

    def test_has_same_partitioning(self):
        sharding0 = concrete([0, 1], Shape([30]), [Shape([10]), Shape([20])])
        assert sharding0.has_same_partitioning(sharding0)
        assert sharding0.has_same_partitioning(
            concrete([2, 3], Shape([30]), [Shape([10]), Shape([20])]))
        # Different number of shards, shape, shard shapes (one larger than the array: the
        # sharding is built and compared as IFRT does, and refused only where used).
        assert not sharding0.has_same_partitioning(
            concrete([2, 3, 4], Shape([60]), [Shape([10]), Shape([20]), Shape([30])]))
        assert not sharding0.has_same_partitioning(
            concrete([2, 3], Shape([40]), [Shape([10]), Shape([20])]))
        assert not sharding0.has_same_partitioning(
            concrete([2, 3], Shape([30]), [Shape([10000]), Shape([20])]))
        assert not sharding0.has_same_partitioning(OpaqueSharding(devs(0, 1)))
        # With index domains.
        domains0 = [IndexDomain([0], [10]), IndexDomain([10], [20])]
        with_domains0 = concrete([0, 1], Shape([30]), [Shape([10]), Shape([20])], domains0)
        assert not sharding0.has_same_partitioning(with_domains0)
        assert not with_domains0.has_same_partitioning(sharding0)
        assert with_domains0.has_same_partitioning(
            concrete([2, 3], Shape([30]), [Shape([10]), Shape([20])], domains0))
        domains1 = [IndexDomain([5], [10]), IndexDomain([15], [20])]  # [15, 35) leaves [30]
        assert not with_domains0.has_same_partitioning(
            concrete([2, 3], Shape([30]), [Shape([10]), Shape([20])], domains1))

    def test_with_device_assignment(self):
        sharding0 = concrete([0, 1], Shape([30]), [Shape([10]), Shape([20])])
        assert sharding0.with_device_assignment(devs(0, 1)) == \
            concrete([0, 1], Shape([30]), [Shape([10]), Shape([20])])
        assert sharding0.with_device_assignment(devs(2, 3)).devices == devs(2, 3)
        domains = [IndexDomain([0], [10]), IndexDomain([10], [20])]
        with_domains = concrete([0, 1], Shape([30]), [Shape([10]), Shape([20])], domains)
        moved = with_domains.with_device_assignment(devs(2, 3))
        assert with_domains.has_same_partitioning(moved)
        assert moved.index_domains(Shape([30]), ADDRESSABLE) == domains
        with pytest.raises(InvalidArgumentError, match="ConcreteSharding should have the same "
                           "number of devices as the current sharding, but was asked to have 4"):
            sharding0.with_device_assignment(devs(0, 1, 2, 3))

    def test_disassemble(self):
        shard_shapes = [Shape([3]), Shape([7]), Shape([3]), Shape([7])]
        sharding = concrete(range(6), Shape([20]), shard_shapes)
        message = ("SingleDeviceShardSemantics::kAllShards was requested, but the ConcreteSharding "
                   "contains non-addressable devices. Saw 6 devices, with 4 addressable devices")
        for args in [(), (ALL,)]:
            with pytest.raises(InvalidArgumentError, match=message):
                sharding.disassemble(Shape([20]), *args)
        check_disassembled(sharding.disassemble(Shape([20]), ADDRESSABLE), shard_shapes, range(4))

    def test_disassemble_fully_addressable(self):
        sharding = concrete([0, 1], Shape([30]), [Shape([10]), Shape([20])])
        check_disassembled(sharding.disassemble(Shape([30])), [Shape([10]), Shape([20])], [0, 1])

    def test_disassemble_dynamic_shape(self):
        shard_shapes = [dyn(3), dyn(7), dyn(3), dyn(7)]
        sharding = concrete(range(6), dyn(20), shard_shapes)
        with pytest.raises(InvalidArgumentError, match="ConcreteSharding holds dynamic shape"):
            sharding.disassemble(Shape([20]))
        for args in [(), (ALL,)]:
            with pytest.raises(InvalidArgumentError, match="Saw 6 devices, with 4 addressable"):
                sharding.disassemble(dyn(20), *args)
        check_disassembled(sharding.disassemble(dyn(20), ADDRESSABLE), shard_shapes, range(4))

    def test_disassemble_fails_for_unexpected_shape(self):
        sharding = concrete([0, 1], Shape([30]), [Shape([10]), Shape([20])])
        with pytest.raises(InvalidArgumentError, match=r"ConcreteSharding can only disassemble "
                           r"shape \[30\], but was asked to disassemble shape \[40\]"):
            sharding.disassemble(Shape([40]))
        with pytest.raises(InvalidArgumentError, match="ConcreteSharding holds static shape"):
            sharding.disassemble(dyn(30))

    def test_index_domains_fully_addressable(self):
        # IFRT's case: the domains cover 3 of the 15 elements; index_domains gives them
        # (an array made with this sharding is refused: see test_refused_where_used).
        domains = [IndexDomain(Index([0]), Shape([1])), IndexDomain(Index([1]), Shape([2]))]
        sharding = concrete([0, 1], Shape([15]), [Shape([1]), Shape([2])], domains)
        for args in [(), (ALL,), (ADDRESSABLE,)]:
            assert sharding.index_domains(Shape([15]), *args) == domains

    def test_index_domains_non_addressable(self):
        domains = [IndexDomain([0], [1]), IndexDomain([1], [2]), IndexDomain([3], [3]),
                   IndexDomain([6], [4])]
        sharding = concrete(range(6), Shape([15]), [d.shape for d in domains], domains)
        with pytest.raises(InvalidArgumentError, match="SingleDeviceShardSemantics::kAllShards was "
                           "requested, but the ConcreteSharding contains index domains from "
                           "non-addressable devices"):
            sharding.index_domains(Shape([15]), ALL)
        assert sharding.index_domains(Shape([15]), ADDRESSABLE) == domains

    def test_index_domains_missing(self):
        sharding = concrete([0, 1], Shape([30]), [Shape([10]), Shape([20])])
        with pytest.raises(InvalidArgumentError,
                           match="ConcreteSharding does not have index domain information"):
            sharding.index_domains(Shape([30]))

    def test_index_domains_fails(self):
        sharding = concrete(range(5), Shape([30]), [Shape([1])] * 5, [IndexDomain([0], [1])] * 5)
        with pytest.raises(InvalidArgumentError, match="ConcreteSharding must have the same number "
                           "of index domains and addressable devices"):
            sharding.index_domains(Shape([1]), ADDRESSABLE)

    def test_hash(self):
        domains0 = [IndexDomain([0], [10]), IndexDomain([10], [20])]
        domains1 = [IndexDomain([5], [10]), IndexDomain([15], [20])]
        check_hash(concrete([0, 1], Shape([30]), [Shape([10]), Shape([20])]),
                   concrete([0, 1], Shape([30]), [Shape([10]), Shape([20])], domains0),
                   concrete([0, 1], Shape([30]), [Shape([10]), Shape([20])], domains1),
                   concrete([0, 1], dyn(30), [dyn(30), dyn(30)]))

    def test_refused_where_used(self):
        """Built as given; refused where data would follow the shapes: disassemble (a
        shard larger than the array), index_domains (a domain outside the array, of
        another shape than its shard, or overlapping another) and check_array_shape (an
        array being made: domains leaving elements without a shard)."""
        too_big = concrete([0, 1], Shape([30]), [Shape([10000]), Shape([20])])
        with pytest.raises(InvalidArgumentError, match=r"shard_shapes\[0\] \[10000\] does not "
                           r"fit in the array's shape \[30\]"):
            too_big.disassemble(Shape([30]))
        with pytest.raises(InvalidArgumentError, match="does not fit"):
            too_big.check_array_shape(Shape([30]))
        cases = {
            "lies outside the shape": [IndexDomain([0], [2]), IndexDomain([3], [2])],
            "does not have the shape of shard_shapes": [IndexDomain([0], [2]),
                                                        IndexDomain([2], [1])],
            "overlap": [IndexDomain([0], [2]), IndexDomain([1], [2])],
        }
        for message, domains in cases.items():
            sharding = concrete([0, 1], Shape([4]), [Shape([2]), Shape([2])], domains)
            for check in (sharding.index_domains, sharding.check_array_shape):
                with pytest.raises(InvalidArgumentError, match=message):
                    check(Shape([4]))
        hole = concrete([0, 1], Shape([15]), [Shape([1]), Shape([2])],
                        [IndexDomain([0], [1]), IndexDomain([1], [2])])
        with pytest.raises(InvalidArgumentError, match=r"cover 3 of the 15 elements of \[15\]"):
            hole.check_array_shape(Shape([15]))
        whole = concrete([0, 1], Shape([3]), [Shape([1]), Shape([2])],
                         [IndexDomain([0], [1]), IndexDomain([1], [2])])
        whole.check_array_shape(Shape([3]))  # a sharding that holds its array passes
        # With non-addressable devices only the addressable domains are known: no cover test.
        partial = concrete(range(6), Shape([15]), [Shape([1]), Shape([2]), Shape([3]), Shape([4])],
                           [IndexDomain([0], [1]), IndexDomain([1], [2]), IndexDomain([3], [3]),
                            IndexDomain([6], [4])])
        partial.check_array_shape(Shape([15]))

    def test_pickle(self):
        domains = [IndexDomain([0], [10]), IndexDomain([10], [20])]
        sharding = concrete([0, 1], Shape([30]), [Shape([10]), Shape([20])], domains)
        assert pickle.loads(pickle.dumps(sharding)) == sharding
        dynamic = concrete([0, 1], dyn(30), [dyn(30), dyn(30)])
        assert pickle.loads(pickle.dumps(dynamic)) == dynamic


def even(ids, shape, shard_shape, replicated):
    return ConcreteEvenSharding(devs(*ids), Shape(shape), Shape(shard_shape), replicated)


class TestConcreteEvenSharding:
    def test_create_with_bad_device_list(self):
        with pytest.raises(InvalidArgumentError, match="non-empty device list"):
            ConcreteEvenSharding(devs(), Shape([]), Shape([]), True)
        with pytest.raises(InvalidArgumentError, match="must not repeat a device"):
            even([0, 0], [30], [15], False)

    def test_is_fully_replicated(self):
        # IFRT takes is_fully_replicated as given, even with a shard half the array.
        assert even([0, 1], [30], [15], True).is_fully_replicated
        assert not even([0, 1], [30], [15], False).is_fully_replicated

    def test_get_shard_shape(self):
        sharding = even([0, 1], [30], [15], True)
        assert sharding.shard_shape(Shape([30])) == Shape([15])
        with pytest.raises(InvalidArgumentError, match=r"ConcreteEvenSharding has a shard shape "
                           r"for "
                           r"shape \[30\], but was asked to get a shard shape for shape \[45\]"):
            sharding.shard_shape(Shape([45]))

    def test_has_same_partitioning(self):
        sharding0 = even([0, 1], [30], [15], True)
        assert sharding0.has_same_partitioning(sharding0)
        assert sharding0.has_same_partitioning(even([2, 3], [30], [15], True))
        assert not sharding0.has_same_partitioning(even([2, 3, 4], [30], [15], True))
        assert not sharding0.has_same_partitioning(even([2, 3], [45], [15], True))
        assert not sharding0.has_same_partitioning(even([2, 3], [30], [10], True))
        assert not sharding0.has_same_partitioning(even([2, 3], [30], [15], False))

    def test_with_device_assignment(self):
        sharding0 = even([0, 1], [30], [15], True)
        assert sharding0.with_device_assignment(devs(2, 3)) == even([2, 3], [30], [15], True)
        with pytest.raises(InvalidArgumentError, match="ConcreteEvenSharding should have the same "
                           "number of devices as the current sharding, but was asked to have 4"):
            sharding0.with_device_assignment(devs(0, 1, 2, 3))

    def test_disassemble(self):
        sharding = even(range(6), [30], [5], False)
        for args in [(), (ALL,)]:
            check_disassembled(sharding.disassemble(Shape([30]), *args), [Shape([5])] * 6, range(6))
        check_disassembled(sharding.disassemble(Shape([30]), ADDRESSABLE), [Shape([5])] * 4,
                           range(4))

    def test_disassemble_fails_for_unexpected_shape(self):
        sharding = even([0, 1], [30], [15], False)
        with pytest.raises(InvalidArgumentError, match="ConcreteEvenSharding can only disassemble"):
            sharding.disassemble(Shape([40]))
        with pytest.raises(InvalidArgumentError, match="can only disassemble static shape"):
            sharding.disassemble(dyn(30))

    def test_index_domains_for_fully_replicated(self):
        shape = Shape([10, 20])
        sharding = even([0, 4], shape, shape, True)  # device 4 is not addressable
        assert sharding.index_domains(shape, ALL) == [IndexDomain(shape)] * 2
        assert sharding.index_domains(shape, ADDRESSABLE) == [IndexDomain(shape)]

    def test_index_domains_fails_for_non_fully_replicated(self):
        with pytest.raises(InvalidArgumentError,
                           match="ConcreteEvenSharding does not have index domain information"):
            even([0, 1], [30], [5], False).index_domains(Shape([30]))

    def test_refused_where_used(self):
        """Built as given (IFRT's cases above); refused where data would follow the
        shapes: disassemble, index_domains and check_array_shape."""
        cases = {
            r"fully replicated .* needs shard_shape == shape": even([0, 1], [30], [15], True),
            r"2 shards of \[10\] cannot hold": even([0, 1], [30], [10], False),
            r"shard_shape \[40\] does not fit": even([0, 1], [30], [40], False),
        }
        for message, sharding in cases.items():
            checks = [sharding.disassemble, sharding.check_array_shape]
            if sharding.is_fully_replicated:
                checks.append(sharding.index_domains)
            for check in checks:
                with pytest.raises(InvalidArgumentError, match=message):
                    check(Shape([30]))
        even([0, 1], [30], [15], False).check_array_shape(Shape([30]))

    def test_hash(self):
        check_hash(even([0, 1], [30], [30], True), even([2, 3], [30], [15], False))


def param_sharding(param, ids=range(6)):
    return ShardingParamSharding(param, devs(*ids))


class TestShardingParam:
    def test_debug_string_and_parse(self):
        param = ShardingParam([2, 1, 3], [1, 0], [2, 3])
        assert param.debug_string() == "2x1x3 to [1,0] on 2x3"
        assert ShardingParam.parse("2x1x3 to [1,0] on 2x3") == param
        assert eval(repr(param)) == param
        assert pickle.loads(pickle.dumps(param)) == param
        assert hash(param) == hash(ShardingParam((2, 1, 3), (1, 0), (2, 3)))

    def test_device_order(self):
        assert ShardingParam([2, 1, 3], [1, 0], [2, 3]).to_device_list() == [0, 2, 4, 1, 3, 5]
        assert ShardingParam([2, 3], [1, 0], [3, 2]).to_device_list() == [0, 3, 1, 4, 2, 5]
        assert ShardingParam([2, 3], [0, 1], [2, 3]).to_device_list() == list(range(6))

    @pytest.mark.parametrize("param, message", [
        (ShardingParam([2], [0, 1], [2]), "Expect same non-zero size for `permutation` and "
                                          "`axis_sizes`. Actual 2 vs 1"),
        (ShardingParam([2], [], []), "Actual 0 vs 0"),
        (ShardingParam([2], [0, 0], [2, 2]), r"`permutation` \[0,0\] has duplicate values"),
        (ShardingParam([2], [0, 2], [2, 2]), r"Out of range axis 2 to the mesh of \[0,2\] on 2x2"),
        (ShardingParam([2, 2], [0], [2]), r"Can't shard the dims 2x2 to the mesh of \[0\] on 2"),
        (ShardingParam([0], [0], [2]), "must be positive"),
    ])
    def test_verify_failures(self, param, message):
        with pytest.raises(InvalidArgumentError, match=message):
            param.verify()

    def test_verify_success(self):
        ShardingParam([2, 1, 3], [1, 0], [3, 2]).verify()
        ShardingParam([1, 6], [1, 0], [3, 2]).verify()
        ShardingParam([], [0], [4]).verify()


class TestShardingParamSharding:
    def test_create_with_bad_device_list(self):
        with pytest.raises(InvalidArgumentError, match="non-empty device list"):
            ShardingParamSharding(P23, devs())

    def test_create_fails_when_device_count_not_match(self):
        with pytest.raises(InvalidArgumentError, match="Device counts don't match. From "
                           "ShardingParam 6 vs from DeviceList 2"):
            ShardingParamSharding(P23, devs(0, 1))

    def test_create_fails_for_invalid_param(self):
        with pytest.raises(InvalidArgumentError, match="Can't shard the dims 4x4"):
            ShardingParamSharding(ShardingParam([4, 4], [0, 1], [2, 3]), devs(*range(6)))

    def test_is_fully_replicated(self):
        assert param_sharding(ShardingParam([1, 1], [1, 0], [3, 2])).is_fully_replicated
        assert not param_sharding(ShardingParam([1, 6], [1, 0], [3, 2])).is_fully_replicated
        assert not param_sharding(P23).is_fully_replicated

    def test_get_shard_shape(self):
        sharding = param_sharding(P23)
        assert sharding.shard_shape(Shape([6, 6])) == Shape([3, 2])
        with pytest.raises(InvalidArgumentError, match="Numbers of dimensions don't match. From "
                           "Shape 3 vs from ShardingParam 2"):
            sharding.shard_shape(Shape([6, 6, 6]))

    def test_has_same_partitioning(self):
        sharding0 = param_sharding(P23)
        assert sharding0.has_same_partitioning(sharding0)
        assert sharding0.has_same_partitioning(param_sharding(P23, [3, 4, 5, 0, 1, 2]))
        assert not sharding0.has_same_partitioning(
            param_sharding(ShardingParam([3, 1], [1, 0], [1, 3]), [3, 4, 5]))
        assert not sharding0.has_same_partitioning(
            param_sharding(ShardingParam([3, 2], [0, 1], [3, 2]), [3, 4, 5, 0, 1, 2]))

    def test_with_device_assignment(self):
        sharding0 = param_sharding(P23)
        assert sharding0.with_device_assignment(devs(3, 4, 5, 0, 1, 2)) == \
            param_sharding(P23, [3, 4, 5, 0, 1, 2])
        with pytest.raises(InvalidArgumentError, match="ShardingParamSharding should have the same "
                           "number of devices as the current sharding, but was asked to have 3"):
            sharding0.with_device_assignment(devs(0, 1, 2))

    def test_disassemble(self):
        sharding = param_sharding(P23)
        for args in [(), (ALL,)]:
            check_disassembled(sharding.disassemble(Shape([6, 6]), *args), [Shape([3, 2])] * 6,
                               range(6))
        check_disassembled(sharding.disassemble(Shape([6, 6]), ADDRESSABLE), [Shape([3, 2])] * 4,
                           range(4))

    def test_disassemble_fails_when_rank_not_match(self):
        with pytest.raises(InvalidArgumentError, match="Numbers of dimensions don't match. From "
                           "Shape 3 vs from ShardingParam 2"):
            param_sharding(P23).disassemble(Shape([6, 6, 6]))

    def test_disassemble_fails_for_uneven_sharding(self):
        with pytest.raises(InvalidArgumentError,
                           match="Uneven shard is not supported. dim: 7, dim_shards: 2"):
            param_sharding(P23).disassemble(Shape([7, 6]))

    def test_disassemble_fails_for_dynamic_shape(self):
        with pytest.raises(InvalidArgumentError, match="can only disassemble static shape"):
            param_sharding(P23).disassemble(dyn(6, 6))

    @staticmethod
    def origins(domains):
        return [tuple(d.origin) for d in domains]

    def test_index_domain(self):
        sharding = param_sharding(ShardingParam([2, 3], [0, 1], [2, 3]))
        expected = [(0, 0), (0, 2), (0, 4), (3, 0), (3, 2), (3, 4)]
        for args in [(), (ALL,)]:
            domains = sharding.index_domains(Shape([6, 6]), *args)
            assert self.origins(domains) == expected
            assert all(d.shape == Shape([3, 2]) for d in domains)
        assert self.origins(sharding.index_domains(Shape([6, 6]), ADDRESSABLE)) == expected[:4]

    def test_index_domain_with_permutation(self):
        sharding = param_sharding(P23)
        expected = [(0, 0), (0, 4), (3, 2), (0, 2), (3, 0), (3, 4)]
        for args in [(), (ALL,)]:
            domains = sharding.index_domains(Shape([6, 6]), *args)
            assert domains == [IndexDomain(o, [3, 2]) for o in expected]
        assert self.origins(sharding.index_domains(Shape([6, 6]), ADDRESSABLE)) == expected[:4]

    def test_index_domain_with_replication(self):
        sharding = param_sharding(ShardingParam([2, 1], [0, 1], [2, 3]))
        expected = [IndexDomain([0, 0], [3, 6])] * 3 + [IndexDomain([3, 0], [3, 6])] * 3
        for args in [(), (ALL,)]:
            assert sharding.index_domains(Shape([6, 6]), *args) == expected
        assert sharding.index_domains(Shape([6, 6]), ADDRESSABLE) == expected[:4]

    def test_slices_on_devices_with_permuted_mesh(self):
        # "2x1x3 to [1,0] on 2x3": slices 0..5 (row-major) land on devices 0,2,4,1,3,5.
        sharding = param_sharding(ShardingParam([2, 1, 3], [1, 0], [2, 3]))
        domains = sharding.index_domains(Shape([2, 1, 3]))
        slice_of_device = [d.origin[0] * 3 + d.origin[2] for d in domains]
        assert [slice_of_device.index(k) for k in range(6)] == [0, 2, 4, 1, 3, 5]

    def test_replication_groups(self):
        # "2x1 to [0,1] on 3x2": tile 0 on devices (0,1,2), tile 1 on (3,4,5).
        sharding = param_sharding(ShardingParam([2, 1], [0, 1], [3, 2]))
        assert self.origins(sharding.index_domains(Shape([4, 4]))) == [(0, 0)] * 3 + [(2, 0)] * 3

    def test_scalar(self):
        sharding = param_sharding(ShardingParam([], [0], [6]))
        assert sharding.is_fully_replicated
        assert sharding.index_domains(Shape([])) == [IndexDomain(Shape([]))] * 6

    def test_hash(self):
        check_hash(param_sharding(P23), param_sharding(P23, [3, 4, 5, 0, 1, 2]))
        assert hash(param_sharding(P23)) == hash(param_sharding(P23))

    def test_pickle_and_repr(self):
        sharding = ShardingParamSharding(P23, devs(*range(6)), "pinned_host")
        assert pickle.loads(pickle.dumps(sharding)) == sharding
        assert repr(sharding).startswith("ShardingParamSharding(2x3 to [1,0] on 3x2, devices: [")
        assert "memory_kind: pinned_host" in repr(sharding)


def test_semantics_argument_is_checked():
    with pytest.raises(TypeError):
        param_sharding(P23).index_domains(Shape([6, 6]), "all")
