"""Build-time errors: each inference rule refuses what StableHLO (as XLA takes it) refuses,
with an InvalidArgumentError naming the op and the operand types, before any compiler."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ifrtpy.builder import Builder
from ifrtpy.errors import InvalidArgumentError

F32, F64, I32, U8, PRED = np.float32, np.float64, np.int32, np.uint8, np.bool_


class V:
    """A fresh builder with a few parameters: f (f32[2,3]), g (f32[3]), d (f64[2,3]),
    i (s32[2,3]), u (u8[2,3]), p (pred[2,3]), s (f32[]), k (s32[]), m (f32[3,4])."""

    def __init__(self):
        self.b = b = Builder()
        self.f = b.parameter((2, 3), F32)
        self.g = b.parameter((3,), F32)
        self.d = b.parameter((2, 3), F64)
        self.i = b.parameter((2, 3), I32)
        self.u = b.parameter((2, 3), U8)
        self.p = b.parameter((2, 3), PRED)
        self.s = b.parameter((), F32)
        self.k = b.parameter((), I32)
        self.m = b.parameter((3, 4), F32)


# (id, builds something invalid, pattern the message must match)
CASES = [
    # elementwise: equal shapes and dtypes, dtype classes
    ("add shapes", lambda v: v.f + v.g, r"^add: .*same shape and dtype.*f32\[2,3\], f32\[3\]"),
    ("add dtypes", lambda v: v.b.add(v.f, v.d), r"^add: .*f32\[2,3\], f64\[2,3\]"),
    ("sub pred", lambda v: v.b.sub(v.p, v.p), r"^sub: needs integer, floating-point or complex.*pred"),
    ("rem pred", lambda v: v.b.rem(v.p, v.p), r"^rem: needs integer or floating-point"),
    ("and float", lambda v: v.f & v.f, r"^and: needs pred or integer operands, got floating-point f32"),
    ("xor float", lambda v: v.b.xor(v.f, v.f), r"^xor: needs pred or integer"),
    ("exp int", lambda v: v.b.exp(v.i), r"^exp: needs floating-point or complex operands, got signed integer s32.*s32\[2,3\]"),
    ("floor int", lambda v: v.b.floor(v.i), r"^floor: needs floating-point"),
    ("abs unsigned", lambda v: abs(v.u), r"^abs: needs signed integer"),
    ("neg pred", lambda v: -v.p, r"^neg: needs integer, floating-point or complex"),
    ("not float", lambda v: ~v.f, r"^not: needs pred or integer"),
    ("scalar out of range", lambda v: v.u + 300, r"^add: 300 is not a u8 value"),
    ("float scalar for int", lambda v: v.i * 1.5, r"^mul: 1.5 is not a s32 value"),
    # compare, select, clamp
    ("compare shapes", lambda v: v.f < v.g, r"^compare: .*f32\[2,3\], f32\[3\]"),
    ("compare direction", lambda v: v.b.compare(v.f, v.f, "XX"), r"direction must be one of EQ"),
    ("select pred dtype", lambda v: v.b.select(v.i, v.f, v.f), r"^select: the predicate must be pred, got s32"),
    ("select branches", lambda v: v.b.select(v.p, v.f, v.d), r"^select: on_true and on_false"),
    ("select pred shape", lambda v: v.b.select(v.b.parameter((3,), PRED), v.f, v.f),
     r"^select: the predicate must be a scalar or have the shape"),
    ("clamp bounds", lambda v: v.b.clamp(v.g, v.f, v.s), r"^clamp: min and max must be scalars"),
    # convert, bitcast_convert
    ("convert complex", lambda v: v.b.convert(v.b.parameter((2,), np.complex64), F32), r"^convert: cannot convert complex"),
    ("convert bad dtype", lambda v: v.b.convert(v.f, object), r"^convert: .* is not an element type"),
    ("bitcast pred", lambda v: v.b.bitcast_convert(v.p, U8), r"^bitcast_convert: pred cannot be bitcast"),
    ("bitcast last dim", lambda v: v.b.bitcast_convert(v.u, F32), r"^bitcast_convert: .*last dimension must be 4.*u8\[2,3\]"),
    # iota, broadcast, reshape, transpose
    ("iota dimension", lambda v: v.b.iota((2, 3), F32, 2), r"^iota: dimension 2 is out of range"),
    ("iota pred", lambda v: v.b.iota((2,), PRED), r"^iota: dtype must be numeric"),
    ("broadcast dims count", lambda v: v.b.broadcast_in_dim(v.f, (2, 3, 4), [0]), r"^broadcast_in_dim: broadcast_dimensions \[0\] must have one entry"),
    ("broadcast dims range", lambda v: v.b.broadcast_in_dim(v.g, (3,), [1]), r"^broadcast_in_dim: broadcast_dimensions \[1\] has 1, out of range"),
    ("broadcast dims dup", lambda v: v.b.broadcast_in_dim(v.f, (3, 3), [0, 0]), r"has duplicates"),
    ("broadcast sizes", lambda v: v.b.broadcast_in_dim(v.g, (4, 2), [1]), r"operand dimension 0 \(size 3\) cannot broadcast to result dimension 1 \(size 2\)"),
    ("broadcast_to rank", lambda v: v.b.broadcast_to(v.f, (3,)), r"^broadcast_to: cannot broadcast to the lower-rank"),
    ("broadcast_to sizes", lambda v: v.b.broadcast_to(v.g, (2, 4)), r"^broadcast_to: operand dimension 0 \(size 3\)"),
    ("reshape count", lambda v: v.f.reshape(4, 2), r"^reshape: cannot reshape 6 elements into \[4, 2\].*f32\[2,3\]"),
    ("transpose perm", lambda v: v.b.transpose(v.f, [0, 0]), r"^transpose: permutation \[0, 0\] is not a permutation"),
    ("reverse dims", lambda v: v.b.reverse(v.f, [2]), r"^reverse: dimensions \[2\] has 2, out of range"),
    # slices
    ("slice bounds", lambda v: v.b.slice(v.f, [0, 2], [2, 1]), r"^slice: dimension 1: need 0 <= start \(2\) <= limit \(1\)"),
    ("slice rank", lambda v: v.b.slice(v.f, [0], [1]), r"^slice: .* need one entry per dimension"),
    ("slice stride", lambda v: v.b.slice(v.f, [0, 0], [2, 3], [1, 0]), r"stride must be positive"),
    ("dynamic_slice count", lambda v: v.b.dynamic_slice(v.f, [v.k], [1, 1]), r"^dynamic_slice: needs 2 start indices, got 1"),
    ("dynamic_slice index type", lambda v: v.b.dynamic_slice(v.f, [v.s, v.s], [1, 1]), r"^dynamic_slice: start indices must be integer scalars, got f32\[\]"),
    ("dynamic_slice sizes", lambda v: v.b.dynamic_slice(v.f, [0, 0], [3, 1]), r"^dynamic_slice: slice size 3 of dimension 0 is outside \[0, 2\]"),
    ("dynamic_update_slice big", lambda v: v.b.dynamic_update_slice(v.g, v.b.parameter((4,), F32), [0]), r"^dynamic_update_slice: the update is larger"),
    ("dynamic_update_slice dtype", lambda v: v.b.dynamic_update_slice(v.f, v.d, [0, 0]), r"^dynamic_update_slice: the update must have the operand's rank and dtype"),
    ("concatenate dims", lambda v: v.b.concatenate([v.f, v.m], 0), r"^concatenate: operands differ in dimension 1.*f32\[2,3\], f32\[3,4\]"),
    ("concatenate dtype", lambda v: v.b.concatenate([v.f, v.d], 0), r"^concatenate: operands must have the same rank and dtype"),
    ("concatenate dimension", lambda v: v.b.concatenate([v.f], 2), r"^concatenate: dimension 2 is out of range"),
    ("pad value", lambda v: v.b.pad(v.f, v.b.constant(np.float64(0)), [0, 0], [0, 0]), r"^pad: the padding value must be a scalar of the operand's dtype"),
    ("pad negative", lambda v: v.b.pad(v.f, 0.0, [-3, 0], [0, 0]), r"^pad: dimension 0 would have negative size -1"),
    ("pad interior", lambda v: v.b.pad(v.f, 0.0, [0, 0], [0, 0], [0, -1]), r"^pad: interior padding of dimension 1 is negative"),
    # dot, conv
    ("dot contracting", lambda v: v.b.dot(v.f, v.f), r"^dot_general: contracting dims lhs 1 \(size 3\) and rhs 0 \(size 2\) differ.*f32\[2,3\], f32\[2,3\]"),
    ("dot rank", lambda v: v.b.dot(v.b.parameter((2, 2, 2), F32), v.f), r"^dot: dot takes rank 1 or 2 operands"),
    ("dot dtypes", lambda v: v.b.dot(v.f, v.b.parameter((3, 2), F64)), r"^dot_general: lhs and rhs must have the same dtype"),
    ("dot_general batch", lambda v: v.b.dot_general(v.f, v.m, ((1,), (0,)), ((0,), (1,))), r"^dot_general: batch dims lhs 0 \(size 2\) and rhs 1 \(size 4\) differ"),
    ("dot_general overlap", lambda v: v.b.dot_general(v.f, v.f, ((0,), (0,)), ((0,), (1,))), r"lhs batch \+ contracting dims \[0, 0\] has duplicates"),
    ("dot_general counts", lambda v: v.b.dot_general(v.f, v.m, ((1,), ()), ((), ())), r"need as many contracting dims"),
    ("dot precision", lambda v: v.b.dot(v.f, v.m, precision="LOW"), r"^dot_general: precision must be one of DEFAULT, HIGH, HIGHEST"),
    ("dot preferred", lambda v: v.b.dot(v.f, v.m, preferred_element_type=I32), r"preferred_element_type s32 does not suit floating-point"),
    ("dot pred", lambda v: v.b.dot(v.p, v.b.parameter((3,), PRED)), r"needs numeric operands, got pred"),
    ("conv features", lambda v: v.b.conv_general_dilated(v.b.parameter((1, 3, 5), F32), v.b.parameter((4, 2, 2), F32), [1], "VALID"),
     r"^conv_general_dilated: input features \(3\) must equal kernel input features \(2\) x feature_group_count \(1\).*f32\[1,3,5\], f32\[4,2,2\]"),
    ("conv groups", lambda v: v.b.conv_general_dilated(v.b.parameter((1, 4, 5), F32), v.b.parameter((3, 2, 2), F32), [1], "VALID", feature_group_count=2),
     r"kernel output features \(3\) must divide by the group count"),
    ("conv batch groups", lambda v: v.b.conv_general_dilated(v.b.parameter((3, 2, 5), F32), v.b.parameter((2, 2, 2), F32), [1], "VALID", batch_group_count=2),
     r"batch \(3\) must divide by batch_group_count \(2\)"),
    ("conv rank", lambda v: v.b.conv_general_dilated(v.f, v.b.parameter((2, 3, 1), F32), [1], "VALID"), r"lhs and rhs must have the same rank"),
    ("conv strides", lambda v: v.b.conv_general_dilated(v.b.parameter((1, 2, 5), F32), v.b.parameter((2, 2, 2), F32), [1, 1], "VALID"), r"window_strides needs 1 entries"),
    ("conv padding", lambda v: v.b.conv_general_dilated(v.b.parameter((1, 2, 5), F32), v.b.parameter((2, 2, 2), F32), [1], "FULL"), r"padding must be 'SAME', 'VALID'"),
    ("conv layout", lambda v: v.b.conv_general_dilated(v.b.parameter((1, 2, 5), F32), v.b.parameter((2, 2, 2), F32), [1], "VALID", dimension_numbers=("NCW", "OIH", "NCW")), r"must use N and C"),
    ("conv window reversal", lambda v: v.b.conv_general_dilated(v.b.parameter((1, 2, 5), F32), v.b.parameter((2, 2, 2), F32), [1], "VALID", window_reversal=[True, False]),
     r"window_reversal must be 1 bools \(one per spatial dimension\), got \[True, False\]"),
    ("conv stride zero", lambda v: v.b.conv_general_dilated(v.b.parameter((1, 2, 5), F32), v.b.parameter((2, 2, 2), F32), [0], [(0, 0)]), r"strides and dilations must be positive"),
    # reductions
    ("reduce dims", lambda v: v.b.reduce(v.f, None, [2]), r"^reduce: dimensions \[2\] has 2, out of range"),
    ("reduce init dtype", lambda v: v.b.reduce(v.f, v.b.constant(np.int32(0)), [0]), r"^reduce: each init value must be a scalar of its input's dtype"),
    ("reduce computation", lambda v: v.b.reduce(v.f, None, [0], "mean"), r"^reduce: computation must be one of sum, prod, max, min, and, or"),
    ("reduce and float", lambda v: v.b.reduce(v.f, None, [0], "and"), r"needs pred or integer operands"),
    ("reduce body type", lambda v: v.b.reduce(v.f, 0.0, [0], lambda a, x: v.b.convert(a, F64)), r"^reduce: the computation returns \(f64\[\]\); it must return \(f32\[\]\)"),
    ("reduce variadic shapes", lambda v: v.b.reduce([v.f, v.g], [0.0, 0.0], [0], lambda a, b, c, d: (a, b)), r"^reduce: inputs must have the same shape"),
    ("reduce fn needs init", lambda v: v.b.reduce(v.f, None, [0], lambda a, x: a + x), r"init_values are needed"),
    ("reduce_window rank", lambda v: v.b.reduce_window(v.f, None, "max", [2]), r"^reduce_window: window_dimensions needs 2 entries"),
    ("reduce_window zero window", lambda v: v.b.reduce_window(v.f, None, "max", [0, 1]), r"window_dimensions must be positive"),
    # gather, scatter
    ("gather index dtype", lambda v: v.b.take(v.f, v.s), r"^gather: indices must be integers, got f32"),
    ("gather map", lambda v: v.b.gather(v.f, v.b.parameter((4, 2), I32), offset_dims=[1], collapsed_slice_dims=[0],
                                        start_index_map=[0], slice_sizes=[1, 3]), r"start_index_map \[0\] needs one entry per index vector element \(2\)"),
    ("gather collapsed", lambda v: v.b.gather(v.f, v.b.parameter((4, 1), I32), offset_dims=[1], collapsed_slice_dims=[0],
                                              start_index_map=[0], slice_sizes=[2, 3]), r"collapsed dimension 0 has slice size 2"),
    ("gather offsets", lambda v: v.b.gather(v.f, v.b.parameter((4, 1), I32), offset_dims=[], collapsed_slice_dims=[0],
                                            start_index_map=[0], slice_sizes=[1, 3]), r"offset_dims \[\] need 1 entries"),
    ("take axis", lambda v: v.b.take(v.f, v.k, axis=2), r"^take: axis 2 is out of range"),
    ("scatter updates", lambda v: v.b.scatter_along(v.f, v.b.parameter((4,), I32), v.b.parameter((2, 5), F32), 1),
     r"^scatter: the update scatter dims \[5\] must match the index batch dims \[4\]"),
    ("scatter dtype", lambda v: v.b.scatter_along(v.f, v.b.parameter((1,), I32), v.b.parameter((1, 3), F64)), r"^scatter: updates must have the operand's dtype"),
    ("scatter window", lambda v: v.b.scatter(v.g, v.b.parameter((1, 1), I32), v.b.parameter((1, 4), F32), update_window_dims=[1],
                                             inserted_window_dims=[], scatter_dims_to_operand_dims=[0]), r"update window dimension 1 \(size 4\) exceeds the operand's 3"),
    ("scatter cover", lambda v: v.b.scatter(v.f, v.b.parameter((1, 1), I32), v.b.parameter((1, 3), F32), update_window_dims=[1],
                                            inserted_window_dims=[], scatter_dims_to_operand_dims=[0]), r"must cover the operand rank"),
    ("scatter computation", lambda v: v.b.scatter_along(v.f, v.b.parameter((1,), I32), v.b.parameter((1, 3), F32), 0, "avg"), r"computation must be one of"),
    # sort
    ("sort shapes", lambda v: v.b.sort([v.f, v.g]), r"^sort: operands must have the same shape"),
    ("sort dimension", lambda v: v.b.sort(v.f, dimension=2), r"^sort: dimension 2 is out of range for rank 2"),
    ("sort comparator type", lambda v: v.b.sort(v.f, comparator=lambda a, b: a - b), r"^sort: the comparator returns \(f32\[\]\); it must return \(pred\[\]\)"),
    ("sort num_keys", lambda v: v.b.sort(v.f, num_keys=2), r"num_keys 2 must be in \[1, 1\]"),
    # control flow
    ("while cond type", lambda v: v.b.while_loop(lambda x: x, lambda x: x, v.f), r"^while_loop: the condition returns \(f32\[2,3\]\); it must return \(pred\[\]\)"),
    ("while body types", lambda v: v.b.while_loop(lambda x: v.k < 3, lambda x: v.b.convert(x, F64), v.f),
     r"^while_loop: the body returns \(f64\[2,3\]\); it must return \(f32\[2,3\]\)"),
    ("cond pred", lambda v: v.b.cond(v.p, lambda: v.f, lambda: v.f), r"^cond: the predicate must be a pred scalar.*pred\[2,3\]"),
    ("cond branches", lambda v: v.b.cond(v.k < 1, lambda: v.f, lambda: v.d), r"^cond: branch 1 returns \(f64\[2,3\]\); it must return \(f32\[2,3\]\)"),
    ("case index", lambda v: v.b.case(v.s, [lambda: v.f]), r"^case: the index must be an s32 scalar"),
    ("case no branches", lambda v: v.b.case(v.k, []), r"^case: needs at least one branch"),
    # parameters, constants, shardings
    ("parameter dtype", lambda v: v.b.parameter((2,), "f33"), r"^parameter: 'f33' is not an element type"),
    ("parameter shape", lambda v: v.b.parameter((2, "x"), F32), r"^parameter: shape must be a sequence of integers"),
    ("parameter sharding rank", lambda v: v.b.parameter((2,), F32, sharding="{devices=[2"), r"not an HLO sharding"),
    ("constant dtype", lambda v: v.b.constant(np.array(["a"])), r"^constant: .* is not an element type"),
    ("operand type", lambda v: v.b.exp("x"), r"^exp: expected a Value or a number, got str"),
]


@pytest.mark.parametrize("build, pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_inference_rules_refuse(build, pattern):
    v = V()
    with pytest.raises(InvalidArgumentError) as info:
        build(v)
    assert re.search(pattern, str(info.value)), str(info.value)


def test_errors_are_raised_before_anything_is_emitted():
    v = V()
    before = v.b.text()
    with pytest.raises(InvalidArgumentError):
        v.f + v.g
    with pytest.raises(InvalidArgumentError):
        v.b.dot(v.f, v.f)
    assert v.b.text() == before


def test_values_of_another_builder_are_refused():
    v, w = V(), V()
    with pytest.raises(InvalidArgumentError, match="belongs to another builder"):
        v.f + w.f


def test_reduce_computations_see_only_their_arguments():
    v = V()
    with pytest.raises(InvalidArgumentError, match="not visible here"):
        v.b.reduce(v.f, 0.0, [0], lambda a, x: a + x * v.s)


def test_region_values_do_not_escape():
    v = V()
    leaked = []

    def body(x):
        leaked.append(x * 2)
        return x

    v.b.while_loop(lambda x: v.k < 1, body, v.f)
    with pytest.raises(InvalidArgumentError, match="made in the body of while_loop, which is not visible"):
        v.b.exp(leaked[0])


def test_parameters_and_build_only_in_main():
    v = V()
    with pytest.raises(InvalidArgumentError, match="parameters can only be added to main"):
        v.b.while_loop(lambda x: v.k < 1, lambda x: x + v.b.parameter((2, 3), F32), v.f)
    with pytest.raises(InvalidArgumentError, match="build: 2 shardings for 1 results"):
        v.b.build(v.f, shardings=[None, None])


def test_values_have_no_truth_value():
    v = V()
    with pytest.raises(TypeError, match="no truth value"):
        if v.f < v.f:
            pass


def test_a_failed_build_leaves_the_builder_usable():
    v = V()
    with pytest.raises(InvalidArgumentError):
        v.b.build(v.f, shardings=["{devices=[2"])
    program = v.b.build(v.f + 1)
    assert len(program.results) == 1 and program.results[0].shape == (2, 3)
    again = v.b.build(v.f, v.g)
    assert len(again.results) == 2
