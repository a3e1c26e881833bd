from typing import Iterable

from ifrtpy._pjrt._base import PluginHandle

TYPE_NAME: str

def install(plugin: PluginHandle, targets: Iterable[str]) -> int: ...
