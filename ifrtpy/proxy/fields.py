"""The fields the server reads and writes, by message, as the IFRT Proxy protocol numbers
and types them in jaxlib 0.10.2, the oldest client served (``name=number:type``;
continuation lines are indented).

The fields of ``IfrtRequest``'s oneof are not written here but read from the request kinds
the server serves (:func:`ifrtpy.proxy.session.kinds`: one record per kind). The server
reads its message classes from the installed jaxlib (:mod:`._protocol`); :func:`mismatches`
compares this table with them, so a jaxlib whose protocol drifted from
what the handlers were written against is found by a test, field by field.
"""

from __future__ import annotations

from ifrtpy.proxy._protocol import message_class

__all__ = ["FIELDS", "expected", "mismatches"]

_TYPES = {1: "double", 2: "float", 3: "int64", 4: "uint64", 5: "int32", 6: "fixed64",
          7: "fixed32", 8: "bool", 9: "string", 11: "message", 12: "bytes", 13: "uint32",
          14: "enum", 15: "sfixed32", 16: "sfixed64", 17: "sint32", 18: "sint64"}

FIELDS = """
tensorflow.StatusProto code=1:enum message=2:string
tensorflow.StatusProto.PayloadEntry key=1:string value=2:bytes
xla.CompileOptionsProto executable_build_options=3:message
    compile_portable_executable=4:bool
xla.CompileOptionsProto.EnvOptionOverridesEntry key=1:string value=2:message
xla.CompiledMemoryStatsProto generated_code_size_in_bytes=1:int64
xla.DeviceAssignmentProto replica_count=1:int32 computation_count=2:int32
    computation_devices=3:message
xla.DeviceAssignmentProto.ComputationDevice replica_device_ids=1:int64
xla.ExecutableBuildOptionsProto num_replicas=4:int64 num_partitions=5:int64
    use_spmd_partitioning=6:bool device_assignment=9:message use_shardy_partitioner=19:bool
    process_index=22:int64
xla.LayoutProto minor_to_major=1:int64 tiles=6:message element_size_in_bits=7:int64
xla.OpSharding type=1:enum tile_assignment_dimensions=3:int64
    tile_assignment_devices=4:int64 tuple_shardings=5:message
    replicate_on_last_tile_dim=6:bool metadata=7:message iota_reshape_dims=9:int64
    iota_transpose_perm=10:int32
xla.ifrt.ArraySpecProto dtype=1:message shape=2:message sharding=3:message layout=4:bytes
xla.ifrt.AttributeMapProto attributes=1:message
xla.ifrt.AttributeMapProto.AttributesEntry key=1:string value=2:message
xla.ifrt.AttributeMapProto.Value string_value=1:bytes bool_value=2:bool
    int64_value=3:sfixed64 int64_list_value=4:message float_value=5:float
xla.ifrt.AttributeMapProto.Value.Int64List elements=1:sfixed64
xla.ifrt.ConcreteEvenShardingProto devices=1:message memory_kind=4:string shape=2:message
    shard_shape=3:message is_fully_replicated=5:bool
xla.ifrt.ConcreteShardingProto devices=1:message memory_kind=4:string shape=2:message
    shard_shapes=3:message
xla.ifrt.DTypeProto kind=1:enum
xla.ifrt.DeviceListProto device_ids=1:int32
xla.ifrt.ExecuteOptionsProto launch_id=3:int32 non_donatable_input_indices=7:int32
    fill_status=9:bool execution_stream_id=11:int64
xla.ifrt.HloShardingProto devices=1:message memory_kind=3:string xla_op_sharding=2:message
xla.ifrt.OpaqueShardingProto devices=1:message memory_kind=2:string
xla.ifrt.PjRtLayoutProto xla_layout=1:message
xla.ifrt.RemapPlanProto input_specs=1:message output_specs=2:message mappings=3:message
xla.ifrt.RemapPlanProto.InputDevices in_array=1:int32
xla.ifrt.RemapPlanProto.InputDevicesForOutput out_array=1:int32
xla.ifrt.RemapPlanProto.MappingProto in_array=1:int32 out_array=2:int32 from_start=3:int64
    from_end=4:int64 from_step=5:int64 to_start=6:int64 to_end=7:int64 to_step=8:int64
xla.ifrt.Serialized type_name=1:string data=2:bytes
xla.ifrt.ShapeProto dims=1:int64
xla.ifrt.ShardingProto serialized_sharding=1:message
xla.ifrt.SingleDeviceShardingProto device_id=1:int32 memory_kind=2:string
xla.ifrt.XlaCompileOptionsProto compile_options=1:message
xla.ifrt.proto.StringArrayContents strings=1:bytes
xla.ifrt.proxy.AssembleArrayFromSingleDeviceArraysResponse array_handle=1:fixed64
xla.ifrt.proxy.BitcastArraysResponse array_handles=1:fixed64
xla.ifrt.proxy.CompileResponse loaded_executable_handle=1:fixed64 name=2:string
    num_devices=3:int32 device_ids=10:int32 addressable_device_ids=5:int32
    fingerprint_value=6:bytes fingerprint_error=7:message ready_future_handle=9:fixed64
xla.ifrt.proxy.CompileResponse.MpmdAddressableDevices.MpmdAddressableDevicesEntry
    key=1:string value=2:message
xla.ifrt.proxy.CopyArraysResponse array_handles=1:fixed64
xla.ifrt.proxy.DeleteArrayResponse deletion_future_handle=1:fixed64
xla.ifrt.proxy.DisassembleIntoSingleDeviceArraysResponse array_handles=1:fixed64
xla.ifrt.proxy.FullyReplicatedShardResponse array_handle=1:fixed64
xla.ifrt.proxy.GetDefaultDeviceAssignmentResponse device_assignment=1:message
xla.ifrt.proxy.GetDefaultLayoutResponse serialized_pjrt_layout=1:bytes
xla.ifrt.proxy.GrpcGetVersionRequest min_version=1:message max_version=2:message
xla.ifrt.proxy.GrpcGetVersionResponse version=1:message
xla.ifrt.proxy.GrpcHostBufferDeleteRequest session_id=1:fixed64 handle=2:fixed64
xla.ifrt.proxy.GrpcHostBufferLookupRequest session_id=1:fixed64 handle=2:fixed64
xla.ifrt.proxy.GrpcHostBufferLookupResponse data=1:bytes
xla.ifrt.proxy.GrpcHostBufferReadFromDiskRequest metadata=1:message
xla.ifrt.proxy.GrpcHostBufferStoreMetadata session_id=1:fixed64 handle=2:fixed64
    buffer_size=3:int64
xla.ifrt.proxy.GrpcHostBufferStoreRequest data=1:bytes
xla.ifrt.proxy.GrpcIfrtSessionMetadata version=1:message initialization_data=2:message
xla.ifrt.proxy.IfrtProxyVersion protocol_version=1:int32 ifrt_serdes_version_number=2:int32
xla.ifrt.proxy.IfrtRequest request_metadata=1:message
xla.ifrt.proxy.IfrtResponse response_metadata=1:message
xla.ifrt.proxy.InitResponse session_id=8:uint64 platform_name=1:string
    platform_version=2:string platform_id=3:uint64 process_index=4:uint64
    runtime_type=5:string all_devices=6:message primary_device_ids=10:int32
    addressable_device_ids=7:int32 memories=9:message client_attributes=11:message
xla.ifrt.proxy.InitResponse.Device id=1:int32 local_device_id=9:int32
    local_hardware_id=2:int32 platform_name=11:string device_kind=3:string
    default_memory_id=7:int32 memory_ids=8:int32 debug_string=4:string to_string=5:string
    attributes=10:message
xla.ifrt.proxy.InitResponse.Memory id=1:int32 memory_space_kind=2:string kind_id=6:int32
    device_ids=3:int32 debug_string=4:string to_string=5:string
xla.ifrt.proxy.IsArrayDeletedResponse deleted=1:bool
xla.ifrt.proxy.LoadedExecutableCostAnalysisResponse status=1:message attributes=2:message
xla.ifrt.proxy.LoadedExecutableDeleteResponse future_handle=1:fixed64
xla.ifrt.proxy.LoadedExecutableExecuteResponse status_handle=1:fixed64 outputs=2:message
xla.ifrt.proxy.LoadedExecutableExecuteResponse.Output dtype=1:message shape=2:message
    sharding=3:message array_handle=4:fixed64
xla.ifrt.proxy.LoadedExecutableFetchExecuteResultResponse.DeviceTimeEntry key=1:string
    value=2:double
xla.ifrt.proxy.LoadedExecutableHumanReadableProgramTextResponse status=1:message
    human_readable_program_text=2:string
xla.ifrt.proxy.LoadedExecutableIsDeletedResponse is_deleted=1:bool
xla.ifrt.proxy.LoadedExecutableMetadataResponse parameter_shardings=1:message
    output_shardings=2:message parameter_layouts_list=4:message
    parameter_layouts_error=5:message output_layouts_list=6:message
    output_layouts_error=7:message output_memory_kinds=3:message
    donated_input_indices=8:message compiled_memory_stats=10:message
    compiled_memory_stats_error=11:message mpmd_compiled_memory_stats_error=14:message
    size_of_generated_code_in_bytes=12:int64
xla.ifrt.proxy.LoadedExecutableMetadataResponse.DonatedInputIndices
    donated_input_indices=1:fixed32
xla.ifrt.proxy.LoadedExecutableMetadataResponse.LayoutList layouts=1:message
xla.ifrt.proxy.LoadedExecutableMetadataResponse.MemoryKindList memory_kinds=1:string
xla.ifrt.proxy.LoadedExecutableMetadataResponse.MpmdCompiledMemoryStats
    compiled_memory_stats=1:message
xla.ifrt.proxy.LoadedExecutableMetadataResponse.MpmdCompiledMemoryStats.CompiledMemoryStatsEntry
    key=1:string value=2:message
xla.ifrt.proxy.LoadedExecutableMetadataResponse.OutputMemoryKind status=1:message
    memory_kind_lists=2:message
xla.ifrt.proxy.LoadedExecutableMetadataResponse.ShardingList shardings=1:message
xla.ifrt.proxy.LoadedExecutableMpmdCostAnalysisResponse status=1:message
    attributes=2:message
xla.ifrt.proxy.LoadedExecutableMpmdCostAnalysisResponse.MpmdAttributes attributes=1:message
xla.ifrt.proxy.LoadedExecutableMpmdCostAnalysisResponse.MpmdAttributes.AttributesEntry
    key=1:string value=2:message
xla.ifrt.proxy.LoadedExecutableMpmdMetadataResponse
    mpmd_compiled_memory_stats_error=2:message
xla.ifrt.proxy.LoadedExecutableMpmdMetadataResponse.MpmdCompiledMemoryStats
    compiled_memory_stats=1:message
xla.ifrt.proxy.LoadedExecutableMpmdMetadataResponse.MpmdCompiledMemoryStats.CompiledMemoryStatsEntry
    key=1:string value=2:message
xla.ifrt.proxy.MakeArrayFromHostBufferResponse array_handle=1:fixed64
xla.ifrt.proxy.MakeArraysFromHostBufferShardsRequest specs=1:message array_handles=2:fixed64
xla.ifrt.proxy.MakeArraysFromHostBufferShardsRequest.HostBuffer dtype=1:message
    shape=2:message host_buffer_handle=3:fixed64 byte_strides=4:message
xla.ifrt.proxy.MakeArraysFromHostBufferShardsRequest.MakeArraysFromHostBufferShardsSpec
    addressable_shard_indices=1:message host_buffers=2:message array_spec=3:message
xla.ifrt.proxy.MakeArraysFromHostBufferShardsRequest.ShardIndices indices=1:int64
xla.ifrt.proxy.MakeArraysFromHostBufferShardsResponse array_handles=1:fixed64
xla.ifrt.proxy.MakeErrorArraysResponse array_handles=1:fixed64
xla.ifrt.proxy.RemapArraysResponse array_handles=1:fixed64
xla.ifrt.proxy.RequestMetadata op_id=1:fixed64
xla.ifrt.proxy.ReshardArraysResponse array_handles=1:fixed64
xla.ifrt.proxy.ResponseMetadata op_id=1:fixed64 status=2:message seq_num=3:int64
"""


def expected() -> dict[str, dict[str, tuple[int, str]]]:
    """The table: message full name -> field name -> (number, type)."""
    table: dict[str, dict[str, tuple[int, str]]] = {}
    message = ""
    for line in FIELDS.strip().splitlines():
        words = line.split()
        if not line.startswith(" "):
            message, words = words[0], words[1:]
            table[message] = {}
        for word in words:
            name, _, rest = word.partition("=")
            number, _, kind = rest.partition(":")
            table[message][name] = (int(number), kind)
    from ifrtpy.proxy.session import kinds

    for name, found in kinds().items():
        table["xla.ifrt.proxy.IfrtRequest"][name] = (found.number, "message")
    return table


def mismatches() -> list[str]:
    """Every field of the table that the installed jaxlib's descriptors lack or number or
    type differently (empty when they agree)."""
    found = []
    for message, fields in expected().items():
        try:
            descriptor = message_class(message).DESCRIPTOR
        except KeyError:
            found.append(f"{message}: not in the installed jaxlib")
            continue
        for name, (number, kind) in fields.items():
            field = descriptor.fields_by_name.get(name)
            if field is None:
                found.append(f"{message}.{name}: missing")
            elif (field.number, _TYPES.get(field.type, str(field.type))) != (number, kind):
                found.append(f"{message}.{name}: expected {number}:{kind}, jaxlib has "
                             f"{field.number}:{_TYPES.get(field.type, field.type)}")
    return found
