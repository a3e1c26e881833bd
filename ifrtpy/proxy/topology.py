"""The answer to a session's first request, InitRequest: the client's platform, devices,
memories and attributes, as the proxy client builds its own Client from them.

Memories get ids of their own here (unique over all devices, in device order), and each
memory kind a ``kind_id`` in order of first appearance.
"""

from __future__ import annotations

from typing import Any

from ifrtpy.proxy import wire
from ifrtpy.proxy._protocol import messages
from ifrtpy.proxy.kind import Kind

__all__ = ["init", "KINDS"]


def _key(memory: Any) -> tuple:
    """What tells memories apart (backends may number them per device)."""
    return memory.id, str(memory.kind), tuple(d.id for d in memory.devices())


def _memories(devices: list[Any]) -> tuple[dict[tuple, int], list[Any]]:
    """(memory key -> wire id, memories in wire-id order) over ``devices``."""
    ids: dict[tuple, int] = {}
    ordered: list[Any] = []
    for device in devices:
        for memory in device.memories():
            if _key(memory) not in ids:
                ids[_key(memory)] = len(ordered)
                ordered.append(memory)
    return ids, ordered


def init(session: Any, request: Any) -> Any:
    client = session.client
    m = messages()
    devices = list(client.devices())
    addressable = list(client.addressable_devices())
    memory_ids, memories = _memories(devices)
    kind_ids: dict[str, int] = {}
    response = m.InitResponse(
        session_id=session.id, platform_name=client.platform_name,
        platform_version=client.platform_version, platform_id=client.platform_id,
        process_index=client.process_index(), runtime_type=client.runtime_type,
        primary_device_ids=[d.id for d in devices],
        addressable_device_ids=[d.id for d in addressable],
        client_attributes=wire.attribute_map(client.attributes()))
    local = {d.id: i for i, d in enumerate(addressable)}
    for device in devices:
        proto = response.all_devices.add(
            id=device.id, local_device_id=local.get(device.id, -1),
            local_hardware_id=local.get(device.id, -1), platform_name=client.platform_name,
            device_kind=device.kind, memory_ids=[memory_ids[_key(x)] for x in device.memories()],
            debug_string=device.debug_string(), to_string=device.to_string(),
            attributes=wire.attribute_map(device.attributes))
        proto.default_memory_id = memory_ids[_key(device.default_memory())]
    for memory in memories:
        kind = str(memory.kind)
        response.memories.add(
            id=memory_ids[_key(memory)], memory_space_kind=kind,
            kind_id=kind_ids.setdefault(kind, len(kind_ids)),
            device_ids=[d.id for d in memory.devices()], debug_string=memory.debug_string(),
            to_string=memory.to_string())
    return response


#: The request kind of this module (see :class:`~ifrtpy.proxy.session.Kind`).
KINDS = {"init_request": Kind(init, 2)}
