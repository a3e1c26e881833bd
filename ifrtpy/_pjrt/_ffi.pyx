# cython: language_level=3, binding=True, embedsignature=True
"""The plugin's FFI extension (``PJRT_Extension_Type_FFI``): XLA FFI handlers registered
with a plugin, user types, and execute contexts that carry user data to handlers.

Differences from the C API:

* Registrations belong to the plugin library (every client of it sees them, made before
  or after them) and last for the process; the first registration of a name wins.
* The plugin drops its framework's refusals: a handler claiming an XLA FFI version the
  framework does not run is "registered" without error and never found. So
  :func:`framework_version` learns the version the plugin's framework runs (once per
  plugin, from the registration-time metadata call of a private probe handler), and
  :func:`handler_metadata` asks a handler which version it claims (calling it in
  metadata mode, as XLA does): callers compare the two before registering.
* Handlers are passed as PyCapsules of ``XLA_FFI_Handler*`` (name ignored, as jax does);
  only the execute stage can be registered (the extension's arguments have no others).
* :class:`ExecuteContext` owns a ``PJRT_ExecuteContext`` and the Python objects whose
  addresses it holds as user data.
* Needs PJRT 0.81 or newer (the extension's layout is that of those plugins); older
  plugins, or plugins without the extension, raise UnimplementedError.
"""

from cpython.pycapsule cimport (
    PyCapsule_CheckExact, PyCapsule_GetName, PyCapsule_GetPointer, PyCapsule_New,
)
from libc.stdint cimport int64_t, uintptr_t

from ifrtpy._pjrt.xla_ffi cimport *
from ifrtpy._pjrt._api cimport *
from ifrtpy._pjrt._base cimport raise_unimplemented, raise_unimplemented_in
from ifrtpy import errors as _errors

#: The oldest PJRT version whose FFI extension has the layout declared in xla_ffi.pxd.
MIN_PJRT_VERSION = (0, 81)
#: The name the version probe is registered under.
PROBE_TARGET = "ifrtpy_xla_ffi_version_probe"
#: The platform name XLA's CPU handlers are registered for.
HOST_PLATFORM = "Host"


# -- the metadata answer of ifrtpy's own handlers -------------------------------------------

cdef inline bint _has_version(const XLA_FFI_Api* api) noexcept nogil:
    return api != NULL and api.struct_size >= XLA_FFI_Api_Version_STRUCT_SIZE + 2 * sizeof(size_t)


cdef XLA_FFI_Error* answer_metadata(XLA_FFI_CallFrame* frame) noexcept nogil:
    """The metadata call of ifrtpy's own handlers: claim the framework's own version (they
    use only structs whose layout no 0.x version changed), or 0.1 where the call frame
    names no API table; no traits."""
    cdef XLA_FFI_Metadata_Extension* extension = <XLA_FFI_Metadata_Extension*>frame.extension_start
    cdef XLA_FFI_Metadata* metadata = extension.metadata
    if metadata == NULL or metadata.struct_size < XLA_FFI_Metadata_STRUCT_SIZE:
        return NULL
    metadata.api_version = XLA_FFI_Api_Version_new()
    if _has_version(frame.api) and frame.api.api_version.major_version == 0:
        metadata.api_version.minor_version = frame.api.api_version.minor_version
    else:
        metadata.api_version.minor_version = 1
    metadata.traits = 0
    return NULL


cdef XLA_FFI_Error* make_error(const XLA_FFI_Api* api, int code, const char* message) noexcept nogil:
    """An XLA FFI error of ``api`` with ``code`` and ``message`` (copied)."""
    cdef XLA_FFI_Error_Create_Args args = XLA_FFI_Error_Create_Args_new()
    args.message = message
    args.errc = code
    return api.XLA_FFI_Error_Create(&args)


# -- the version probe ---------------------------------------------------------------------

# What the probe's last metadata call saw (written under the GIL's protection: the probe
# is only registered, and so only called, from register_handler below, holding the GIL).
cdef const XLA_FFI_Api* _seen_api = NULL


cdef XLA_FFI_Error* _probe(XLA_FFI_CallFrame* frame) noexcept nogil:
    global _seen_api
    if is_metadata_call(frame):
        _seen_api = frame.api
        return answer_metadata(frame)
    return NULL


cdef XLA_FFI_Error* _noop(XLA_FFI_CallFrame* frame) noexcept nogil:
    if is_metadata_call(frame):
        return answer_metadata(frame)
    return NULL


#: Per plugin path: (major, minor, XLA_FFI_Api address).
cdef dict _frameworks = {}


cdef const XLA_FFI_Api* framework_api(PluginHandle plugin) except NULL:
    """The plugin's XLA FFI function table (learnt by the probe)."""
    return <const XLA_FFI_Api*><uintptr_t>_framework(plugin)[2]


cdef tuple _framework(PluginHandle plugin):
    global _seen_api
    known = _frameworks.get(plugin.path)
    if known is not None:
        return known
    _seen_api = NULL
    _register(plugin, PROBE_TARGET, <void*>_probe, HOST_PLATFORM, 0)
    cdef const XLA_FFI_Api* api = _seen_api
    _seen_api = NULL
    if not _has_version(api):
        raise _errors.UnimplementedError(
            f"the plugin {plugin.path} (PJRT {plugin.api_version[0]}.{plugin.api_version[1]}) "
            "did not tell its XLA FFI version when a handler was registered; ifrtpy cannot "
            "check handlers against it")
    known = (api.api_version.major_version, api.api_version.minor_version, <uintptr_t>api)
    _frameworks[plugin.path] = known
    return known


def framework_version(PluginHandle plugin not None):
    """``(major, minor)``: the XLA FFI version the plugin's framework runs. The plugin
    takes handlers claiming this version or an older one of the same major version."""
    return _framework(plugin)[:2]


# -- handlers as capsules --------------------------------------------------------------------

cdef void* handler_pointer(object handler) except NULL:
    if not PyCapsule_CheckExact(handler):
        raise _errors.invalid_argument("handler", "a PyCapsule of an XLA FFI handler", handler)
    cdef void* pointer = PyCapsule_GetPointer(handler, PyCapsule_GetName(handler))
    if pointer == NULL:
        raise _errors.InvalidArgumentError("the handler's PyCapsule holds a null pointer")
    return pointer


cdef object capsule(void* pointer):
    """A PyCapsule (no name) of the handler at ``pointer``."""
    return PyCapsule_New(pointer, NULL, NULL)


def noop_handler():
    """A capsule of a handler that does nothing (for targets such as ``dce_sink``)."""
    return capsule(<void*>_noop)


def handler_metadata(PluginHandle plugin not None, handler):
    """``(major, minor, traits)`` a handler claims in XLA's metadata call (made with the
    plugin's API table, as the plugin itself makes it). InvalidArgumentError when the
    handler answers with an error."""
    cdef void* pointer = handler_pointer(handler)
    cdef const XLA_FFI_Api* api = framework_api(plugin)
    cdef XLA_FFI_Metadata metadata = XLA_FFI_Metadata_new()
    cdef XLA_FFI_Metadata_Extension extension = XLA_FFI_Metadata_Extension_new()
    cdef XLA_FFI_CallFrame frame = XLA_FFI_CallFrame_new()
    cdef XLA_FFI_Error* error
    cdef XLA_FFI_Error_GetMessage_Args message = XLA_FFI_Error_GetMessage_Args_new()
    cdef XLA_FFI_Error_Destroy_Args destroy = XLA_FFI_Error_Destroy_Args_new()
    metadata.api_version = XLA_FFI_Api_Version_new()
    extension.extension_base.type = XLA_FFI_Extension_Metadata
    extension.metadata = &metadata
    frame.extension_start = &extension.extension_base
    frame.api = api
    frame.stage = XLA_FFI_ExecutionStage_EXECUTE
    frame.args = XLA_FFI_Args_new()
    frame.rets = XLA_FFI_Rets_new()
    frame.attrs = XLA_FFI_Attrs_new()
    with nogil:
        error = (<XLA_FFI_Handler>pointer)(&frame)
    if error != NULL:
        message.error = error
        api.XLA_FFI_Error_GetMessage(&message)
        text = (message.message or b"").decode("utf-8", "replace")
        destroy.error = error
        api.XLA_FFI_Error_Destroy(&destroy)
        raise _errors.InvalidArgumentError(f"the handler failed XLA's metadata query: {text}")
    return (metadata.api_version.major_version, metadata.api_version.minor_version,
            metadata.traits)


# -- the extension -----------------------------------------------------------------------------

cdef const PJRT_FFI_Extension* _ffi_extension(PluginHandle plugin) except NULL:
    """The plugin's FFI extension; UnimplementedError where it has none ifrtpy knows
    (its functions' own checks are the generated wrappers')."""
    cdef const PJRT_Api* api = plugin.api
    cdef const PJRT_FFI_Extension* ext = FFI_extension(api)
    name = f"the plugin {plugin.path} (PJRT {plugin.api_version[0]}.{plugin.api_version[1]})"
    if tuple(plugin.api_version) < MIN_PJRT_VERSION:
        raise _errors.UnimplementedError(
            f"{name} is older than PJRT {MIN_PJRT_VERSION[0]}.{MIN_PJRT_VERSION[1]}, whose FFI "
            "extension ifrtpy knows: it cannot register XLA FFI handlers")
    if ext == NULL:
        raise _errors.UnimplementedError(
            f"{name} has no FFI extension: it cannot register XLA FFI handlers")
    if ext.base.struct_size < PJRT_FFI_Extension_STRUCT_SIZE:
        raise _errors.UnimplementedError(
            f"{name} has an FFI extension of {ext.base.struct_size} bytes, ifrtpy needs "
            f"{PJRT_FFI_Extension_STRUCT_SIZE}")
    return ext


cdef int _register(PluginHandle plugin, str name, void* handler, str platform,
                   unsigned int traits) except -1:
    _ffi_extension(plugin)
    cdef bytes name_bytes = name.encode()
    cdef bytes platform_bytes = platform.encode()
    cdef PJRT_FFI_Register_Handler_Args args = PJRT_FFI_Register_Handler_Args_new()
    args.target_name = name_bytes
    args.target_name_size = len(name_bytes)
    args.handler = handler
    args.platform_name = platform_bytes
    args.platform_name_size = len(platform_bytes)
    args.traits = traits
    PJRT_FFI_Register_Handler(plugin.api, &args)
    return 0


def register_handler(PluginHandle plugin not None, str name not None, handler,
                     str platform not None=HOST_PLATFORM, traits=0):
    """Register ``handler`` (a capsule of an ``XLA_FFI_Handler*``, its execute stage) as
    custom call target ``name`` on ``platform`` ("Host" for CPU) with the plugin. The
    plugin silently keeps the first registration of a name and silently drops handlers
    claiming a version its framework does not run: check before calling this."""
    if not name:
        raise _errors.InvalidArgumentError("a custom call target needs a name")
    if name == PROBE_TARGET:
        raise _errors.InvalidArgumentError(f"{PROBE_TARGET!r} is reserved by ifrtpy")
    cdef unsigned int bits = _errors.check_int(traits, "traits", 0, 2**32 - 1)
    _register(plugin, name, handler_pointer(handler), platform, bits)


def register_type(PluginHandle plugin not None, str name not None):
    """The plugin's type id for user data type ``name`` (registered on first use)."""
    _ffi_extension(plugin)
    cdef bytes name_bytes = name.encode()
    cdef PJRT_FFI_Type_Info info = PJRT_FFI_Type_Info(deleter=NULL, serialize=NULL,
                                                      deserialize=NULL)
    cdef PJRT_FFI_Type_Register_Args args = PJRT_FFI_Type_Register_Args_new()
    args.type_name = name_bytes
    args.type_name_size = len(name_bytes)
    args.type_info = &info
    PJRT_FFI_Type_Register(plugin.api, &args)
    return args.type_id


cdef class ExecuteContext:
    """Owns a ``PJRT_ExecuteContext`` holding, for each type id of ``user_data``, the
    address of its object (held here as long as the context lives). An execute that
    passes the context must keep it alive until the execution completes."""

    def __init__(self, ClientHandle client not None, dict user_data not None):
        cdef const PJRT_Api* api = client.api
        cdef PJRT_ExecuteContext_Create_Args create
        cdef PJRT_FFI_UserData_Add_Args add
        if not has_PJRT_ExecuteContext_Destroy(api):  # a context that could not be destroyed
            raise_unimplemented(api, b"PJRT_ExecuteContext_Destroy")
        _ffi_extension(client.plugin)
        if not has_PJRT_FFI_UserData_Add(api):
            raise_unimplemented_in(api, b"FFI", b"PJRT_FFI_UserData_Add")
        self.client = client
        self.user_data = dict(user_data)
        create = PJRT_ExecuteContext_Create_Args_new()
        PJRT_ExecuteContext_Create(api, &create)
        self.ptr = create.context
        for type_id, obj in self.user_data.items():
            add = PJRT_FFI_UserData_Add_Args_new()
            add.context = self.ptr
            add.type_id = _errors.check_int(type_id, "type id", 1, 2**63 - 1)
            add.data = <void*>obj
            PJRT_FFI_UserData_Add(api, &add)

    def __dealloc__(self):
        cdef PJRT_ExecuteContext_Destroy_Args destroy
        if self.ptr != NULL:
            destroy = PJRT_ExecuteContext_Destroy_Args_new()
            destroy.context = self.ptr
            self.ptr = NULL
            PJRT_ExecuteContext_Destroy_quiet(self.client.api, &destroy)

    def __repr__(self):
        return f"<ExecuteContext of {sorted(self.user_data)}>"
