from ifrtpy._pjrt._base import PluginHandle

CPU_TARGETS: tuple[str, ...]
TYPE_NAME: str

def install(plugin: PluginHandle) -> int: ...
