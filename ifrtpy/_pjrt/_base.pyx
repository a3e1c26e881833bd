# cython: language_level=3, binding=True, embedsignature=True
"""Plugin loading and the one checked calling sequence of the PJRT C API.

Differences from the C API:

* A plugin is loaded once per real path and never unloaded (plugins keep threads and
  static state; ``dlclose`` is not safe for them). ``PJRT_Plugin_Initialize`` runs once.
* Every call goes through its generated wrapper (``_api.pxd``, from ``api_functions.txt``):
  a function slot beyond the plugin's ``struct_size``, NULL, or newer than the plugin's
  API version raises UnimplementedError naming the function and the plugin's version;
  every ``PJRT_Error*`` goes through :c:func:`check`, which reads its code and message,
  destroys it exactly once, and raises the matching :mod:`ifrtpy.errors` class.
* A plugin without the error functions (``PJRT_Error_Destroy``, ``_Message``,
  ``_GetCode``) is refused at load: nothing it does could be reported.
* Named values (attributes, options) are plain dicts of str, int, list[int], float, bool.
"""

import os

from libc.stdint cimport int64_t
from libc.string cimport memset
from posix.dlfcn cimport dlopen, dlsym, dlerror, RTLD_NOW, RTLD_LOCAL

from ifrtpy._pjrt._api cimport *
from ifrtpy import errors as _errors

cdef object _error_from_code = _errors.error_from_code

#: Plugins loaded so far, by real path.
cdef dict _plugins = {}


cdef str to_str(const char* data, size_t size):
    if data == NULL:
        return ""
    return data[:size].decode("utf-8", "replace")


cdef object error_to_exception(const PJRT_Api* api, PJRT_Error* error):
    """The exception for ``error``, which is destroyed here."""
    cdef PJRT_Error_GetCode_Args code_args
    cdef PJRT_Error_Message_Args message_args
    cdef PJRT_Error_Destroy_Args destroy_args
    code_args = PJRT_Error_GetCode_Args_new()
    code_args.error = error
    cdef PJRT_Error* code_error = PJRT_Error_GetCode(api, &code_args)
    cdef int code = 2 if code_error != NULL else <int>code_args.code
    message_args = PJRT_Error_Message_Args_new()
    message_args.error = error
    PJRT_Error_Message(api, &message_args)
    message = to_str(message_args.message, message_args.message_size)
    destroy_args = PJRT_Error_Destroy_Args_new()
    destroy_args.error = error
    PJRT_Error_Destroy(api, &destroy_args)
    if code_error != NULL:
        destroy_args.error = code_error
        PJRT_Error_Destroy(api, &destroy_args)
    return _error_from_code(code, message)


cdef void drop_error(const PJRT_Api* api, PJRT_Error* error) noexcept nogil:
    """Destroy ``error`` (if any) unread: for paths with no one to report to, no GIL."""
    cdef PJRT_Error_Destroy_Args args
    if error != NULL:
        args = PJRT_Error_Destroy_Args_new()
        args.error = error
        PJRT_Error_Destroy(api, &args)


cdef int check(const PJRT_Api* api, PJRT_Error* error) except -1 nogil:
    if error == NULL:
        return 0
    with gil:
        raise error_to_exception(api, error)


cdef int raise_unimplemented(const PJRT_Api* api, const char* name) except -1 nogil:
    """Raise UnimplementedError: the plugin lacks the function ``name`` (a slot beyond its
    table, NULL, or newer than its version)."""
    with gil:
        raise _errors.UnimplementedError(
            f"{name.decode()} is not provided by this PJRT plugin (API version "
            f"{api.pjrt_api_version.major_version}.{api.pjrt_api_version.minor_version}, "
            f"function table of {api.struct_size} bytes)"
        )


cdef int raise_unimplemented_in(const PJRT_Api* api, const char* extension,
                                const char* name) except -1 nogil:
    """Raise UnimplementedError: the plugin lacks the function ``name`` of its extension
    ``extension`` (no such extension, one too short to hold it, or NULL there)."""
    with gil:
        raise _errors.UnimplementedError(
            f"{name.decode()} is not provided by this PJRT plugin: it has no "
            f"{extension.decode()} extension with it (API version "
            f"{api.pjrt_api_version.major_version}.{api.pjrt_api_version.minor_version})"
        )


cdef dict named_values_to_dict(const PJRT_NamedValue* values, size_t count):
    cdef dict out = {}
    cdef size_t i, j
    cdef const PJRT_NamedValue* v
    for i in range(count):
        v = &values[i]
        name = to_str(v.name, v.name_size)
        if v.type == PJRT_NamedValue_kString:
            out[name] = to_str(v.string_value, v.value_size)
        elif v.type == PJRT_NamedValue_kInt64:
            out[name] = v.int64_value
        elif v.type == PJRT_NamedValue_kInt64List:
            out[name] = [v.int64_array_value[j] for j in range(v.value_size)]
        elif v.type == PJRT_NamedValue_kFloat:
            out[name] = v.float_value
        elif v.type == PJRT_NamedValue_kBool:
            out[name] = bool(v.bool_value)
    return out


def loaded_plugins():
    """The plugins this process has loaded: a dict from real path to PluginHandle."""
    return dict(_plugins)


def load_plugin(path):
    """The PluginHandle of the plugin at ``path`` (which plugin is the default is the
    PjRt backend's choice: ``ifrtpy.plugins.builds.default_cpu_library``).

    Loading is idempotent per real path. Raises NotFoundError for a missing file and
    InvalidArgumentError for a file that is not a PJRT plugin.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise _errors.NotFoundError(f"no PJRT plugin file at {path!r}")
    real = os.path.realpath(path)
    plugin = _plugins.get(real)
    if plugin is None:
        plugin = PluginHandle.__new__(PluginHandle)
        (<PluginHandle>plugin)._load(real)
        _plugins[real] = plugin
    return plugin


cdef class PluginHandle:
    """A loaded PJRT plugin: its ``PJRT_Api`` table, API version and attributes, and
    ``missing_functions``: the names of the functions ifrtpy calls (api_functions.txt)
    that its table lacks (beyond its size, NULL, or newer than its version); calling one
    raises UnimplementedError."""

    def __init__(self, *args, **kwargs):
        raise TypeError("use ifrtpy._pjrt.load_plugin(path)")

    cdef _load(self, str path):
        cdef bytes c_path = os.fsencode(path)
        cdef void* library = dlopen(c_path, RTLD_NOW | RTLD_LOCAL)
        if library == NULL:
            reason = dlerror()
            raise _errors.InvalidArgumentError(
                f"cannot load {path!r} as a shared library: "
                f"{reason.decode(errors='replace') if reason != NULL else 'unknown reason'}"
            )
        cdef GetPjrtApi_fn get_api = <GetPjrtApi_fn>dlsym(library, b"GetPjrtApi")
        if get_api == NULL:
            raise _errors.InvalidArgumentError(
                f"{path!r} is a shared library but not a PJRT plugin: it does not export GetPjrtApi"
            )
        cdef const PJRT_Api* api = get_api()
        if api == NULL:
            raise _errors.InternalError(f"GetPjrtApi of {path!r} returned NULL")
        cdef size_t header = (<size_t>(<const char*>&api.pjrt_api_version - <const char*>api)
                              + sizeof(PJRT_Api_Version))
        if api.struct_size < header:
            raise _errors.FailedPreconditionError(
                f"PJRT plugin {path!r} has a function table of {api.struct_size} bytes, "
                f"too small to hold its version"
            )
        major = api.pjrt_api_version.major_version
        minor = api.pjrt_api_version.minor_version
        if major != PJRT_API_MAJOR:
            raise _errors.FailedPreconditionError(
                f"PJRT plugin {path!r} has API version {major}.{minor}; ifrtpy speaks "
                f"major version {PJRT_API_MAJOR} (built against {PJRT_API_MAJOR}.{PJRT_API_MINOR})"
            )
        cdef const char* missing = missing_loaded(api)
        if missing != NULL:
            raise _errors.FailedPreconditionError(
                f"PJRT plugin {path!r} (API version {major}.{minor}) has no {missing.decode()}: "
                "ifrtpy could not report any of its errors")
        self.api = api
        self._library = library
        self.path = path
        self.api_version = (major, minor)
        self.missing_functions = missing_functions(api)

        cdef PJRT_Plugin_Initialize_Args init_args = PJRT_Plugin_Initialize_Args_new()
        PJRT_Plugin_Initialize(api, &init_args)

        cdef PJRT_Plugin_Attributes_Args attr_args = PJRT_Plugin_Attributes_Args_new()
        PJRT_Plugin_Attributes(api, &attr_args)
        self.attributes = named_values_to_dict(attr_args.attributes, attr_args.num_attributes)

    @property
    def api_struct_size(self):
        """Size in bytes of the plugin's ``PJRT_Api`` function table."""
        return self.api.struct_size

    @property
    def extensions(self):
        """``PJRT_Extension_Type`` numbers of the plugin's extension chain, in order."""
        cdef list out = []
        cdef const PJRT_Extension_Base* ext = self.api.extension_start
        while ext != NULL:
            out.append(ext.type)
            ext = ext.next
        return out

    def __repr__(self):
        return f"<PluginHandle {self.path!r} PJRT {self.api_version[0]}.{self.api_version[1]}>"


# -- the exit guard of callbacks from plugin threads ------------------------------------------

cdef extern from *:
    """
    #if PY_VERSION_HEX >= 0x030D0000
    #define ifrtpy_is_finalizing() Py_IsFinalizing()
    #else
    #define ifrtpy_is_finalizing() _Py_IsFinalizing()
    #endif
    /* Once set (at interpreter exit), plugin threads no longer take the GIL for
       callbacks; `running` counts those that have passed the guard. */
    static int ifrtpy_exiting = 0;
    static long ifrtpy_running = 0;
    static int ifrtpy_callback_enter(void) {
        __atomic_add_fetch(&ifrtpy_running, 1, __ATOMIC_SEQ_CST);
        if (!__atomic_load_n(&ifrtpy_exiting, __ATOMIC_SEQ_CST)) return 1;
        __atomic_sub_fetch(&ifrtpy_running, 1, __ATOMIC_SEQ_CST);
        return 0;
    }
    static void ifrtpy_callback_leave(void) {
        __atomic_sub_fetch(&ifrtpy_running, 1, __ATOMIC_SEQ_CST);
    }
    static void ifrtpy_set_exiting(void) {
        __atomic_store_n(&ifrtpy_exiting, 1, __ATOMIC_SEQ_CST);
    }
    static long ifrtpy_callbacks_running(void) {
        return __atomic_load_n(&ifrtpy_running, __ATOMIC_SEQ_CST);
    }
    """
    int ifrtpy_is_finalizing() nogil
    int ifrtpy_callback_enter() nogil
    void ifrtpy_callback_leave() nogil
    void ifrtpy_set_exiting() nogil
    long ifrtpy_callbacks_running() nogil


cdef bint callback_enter() noexcept nogil:
    """For a plugin or foreign thread about to take the GIL: False once the interpreter is
    exiting or finalizing (then it must not: taking the GIL could block the thread for
    good, or end it); otherwise counted until ``callback_leave``."""
    return not ifrtpy_is_finalizing() and ifrtpy_callback_enter()


cdef void callback_leave() noexcept nogil:
    ifrtpy_callback_leave()


def _stop_callbacks_at_exit(double timeout=5.0):
    """From now on plugin threads drop callbacks instead of taking the GIL; wait (GIL
    released, at most ``timeout`` seconds) for those already past that point. Run at
    interpreter exit, after every other exit handler of code that imported ifrtpy."""
    import time
    ifrtpy_set_exiting()
    deadline = time.monotonic() + timeout
    while ifrtpy_callbacks_running() and time.monotonic() < deadline:
        time.sleep(0.001)  # releases the GIL: the running callbacks can finish


import atexit as _atexit
_atexit.register(_stop_callbacks_at_exit)
