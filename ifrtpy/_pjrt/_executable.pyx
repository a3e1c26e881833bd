# cython: language_level=3, binding=True, embedsignature=True
"""PJRT compilation and loaded executables.

Differences from the C API:

* ``compile`` takes StableHLO (text or bytecode) only, and refuses empty compile options
  (the CPU plugin aborts on them). It does not parse the options: they are the caller's
  contract, a serialized CompileOptionsProto with at least one replica and one partition
  (the CPU plugin aborts on fewer; the PjRt backend builds them from a checked
  ``ifrtpy.CompileOptions``).
* An ExecutableHandle owns both the ``PJRT_LoadedExecutable*`` and the
  ``PJRT_Executable*`` behind it, and caches the name, output count and addressable
  devices read at load time.
* ``execute`` takes one list of BufferHandles per addressable device and returns
  ``(outputs, events)``: outputs[device][output] BufferHandles and one completion
  EventHandle per device; ``execute_by_argument`` is the same call with the buffers
  grouped by argument and output (how arrays hold them).
* Functions beyond the plugin's table raise UnimplementedError (see ``_base``).
* An executable marked ``needs_context`` (by its owner, which knows that its program
  makes host callbacks) runs only with an ``execute_context`` set (the plugin crashes on
  one executed without); each execute holds the context until its completion events fire
  (asked for if the caller did not).
* An executable marked ``reads_completion`` (by its owner, where the plugin runs small
  programs inline: the CPU) asks for every execute's completion events and reads them as
  the plugin returns: the outputs of an execution complete by then are marked ready, and
  waiting for them asks the plugin nothing. (An accelerator's execute returns while its
  program runs; there the events would cost each execute and mark nothing.)
* The executions of programs with host callbacks not yet complete are counted per device
  (``callback_executions``), for the caller's limits on executes made inside a callback
  (the PjRt backend's, ``ifrtpy.backends.pjrt.execute_limits``). An execute whose inline
  callback ended in KeyboardInterrupt (Ctrl-C) raises KeyboardInterrupt, not the plugin's
  error.
* Every buffer an execute hands the plugin is pinned until the plugin returns
  (``_buffer.pin_for_execute``); which executes may share or donate a buffer is the
  caller's rule, applied as each is pinned (``_execute``'s ``admit``; the PjRt backend's
  donation rules), and so is which arguments a call donates: the caller works the set
  out (the program's donated parameters less its non-donatable ones) and hands it on.
* ``ExecutableHandle.serialize`` returns the plugin's own bytes and ``deserialize_and_load``
  hands the bytes it is given to the plugin unchecked: a plugin aborts on a corrupted
  serialized executable, so the caller must know them intact (the PjRt backend seals
  them with the plugin's identity and a SHA-256 checksum, ``ifrtpy.backends.pjrt.seal``,
  and checks the seal before this call).
"""

from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_New, PyTuple_SET_ITEM
from libc.stdint cimport int64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memset
cimport cython

from ifrtpy._pjrt._api cimport *
from ifrtpy._pjrt._base cimport (PluginHandle, check, drop_error, named_values_to_dict,
                                 raise_unimplemented, to_str)
from ifrtpy._pjrt._client cimport ClientHandle, DeviceHandle
from ifrtpy._pjrt._buffer cimport (BufferHandle, NewBuffer, destroy_new_buffers,
                                   pin_for_execute, take_buffer, unpin_after_execute)
from ifrtpy._pjrt._event cimport EventHandle, fired_without_error, keep_alive_until
from ifrtpy._pjrt._ffi cimport ExecuteContext
from ifrtpy._pjrt._host_callback cimport forget_interrupt, in_host_callback, take_interrupt
from ifrtpy import errors as _errors

DEF SMALL = 8
DEF SCRATCH = 32  # pointer-sized slots of an execute's arrays kept on the stack


#: Per DeviceHandle: the executions of programs with host callbacks on that device and not
#: yet complete (one _Running each, held until its completion event fires).
cdef dict _callback_executions = {}


@cython.final
cdef class _Running:
    """Counts one execution of a program with host callbacks on ``device`` while it lives."""

    cdef object device

    def __cinit__(self, device):
        self.device = device
        _callback_executions[device] = _callback_executions.get(device, 0) + 1

    def __dealloc__(self):
        if _callback_executions is None:  # the module is being torn down
            return
        left = _callback_executions.pop(self.device, 1) - 1
        if left:
            _callback_executions[self.device] = left


cpdef Py_ssize_t callback_executions(DeviceHandle device) except -1:
    """The executions of programs with host callbacks (an ``execute_context``) on
    ``device`` that have not completed: each counts from its execute until its completion
    event fires."""
    return _callback_executions.get(device, 0)


def compile(ClientHandle client not None, bytes code not None, bytes compile_options not None):
    """Compile StableHLO ``code`` (text or bytecode) with ``compile_options``, a serialized
    CompileOptionsProto; returns an ExecutableHandle.

    Empty ``compile_options`` raise InvalidArgumentError (the CPU plugin aborts on them);
    otherwise they are handed to the plugin unparsed: the caller guarantees a valid proto
    with ``num_replicas`` and ``num_partitions`` at least 1 (the CPU plugin aborts the
    process on 0)."""
    cdef const PJRT_Api* api = client.api
    cdef PJRT_Program program
    cdef PJRT_Client_Compile_Args args
    if not compile_options:
        raise _errors.InvalidArgumentError(
            "compile options are empty; pass a serialized xla CompileOptionsProto "
            "(e.g. jaxlib.xla_client.CompileOptions().SerializeAsString())")
    program = PJRT_Program_new()
    program.code = <char*>code
    program.code_size = len(code)
    program.format = b"mlir"
    program.format_size = 4
    args = PJRT_Client_Compile_Args_new()
    args.client = client.ptr
    args.program = &program
    args.compile_options = compile_options
    args.compile_options_size = len(compile_options)
    PJRT_Client_Compile(api, &args)
    return ExecutableHandle._wrap(client, args.executable)


def deserialize_and_load(ClientHandle client not None, bytes serialized not None):
    """Load ``serialized``, the bytes ``ExecutableHandle.serialize`` returned with the same
    plugin. They are handed to the plugin unchecked: a plugin may abort the process on
    corrupted bytes, so the caller must know them intact (the PjRt backend's seal,
    ``ifrtpy.backends.pjrt.seal``, checks them first)."""
    cdef const PJRT_Api* api = client.api
    cdef PJRT_Executable_DeserializeAndLoad_Args args = PJRT_Executable_DeserializeAndLoad_Args_new()
    args.client = client.ptr
    args.serialized_executable = serialized
    args.serialized_executable_size = len(serialized)
    PJRT_Executable_DeserializeAndLoad(api, &args)
    return ExecutableHandle._wrap(client, args.loaded_executable)


cdef tuple new_event_handles(ClientHandle client, Py_ssize_t count):
    """``count`` EventHandles of ``client`` owning no event yet."""
    cdef tuple out = PyTuple_New(count)
    cdef Py_ssize_t i
    for i in range(count):
        event = EventHandle.wrap(client, client.api, NULL)
        Py_INCREF(event)
        PyTuple_SET_ITEM(out, i, event)
    return out


cdef int hold_buffers(object group, Py_ssize_t k, Py_ssize_t num_devices,
                      PyObject** held) except -1:
    """Argument ``k``'s buffers, ``group`` (a tuple, one per device), written to
    ``held[0:num_devices]`` as new references, for ``_execute``; nothing is written where
    ``group`` is not such a tuple (InvalidArgumentError)."""
    cdef Py_ssize_t d
    cdef PyObject* item
    if not isinstance(group, tuple):
        raise _errors.invalid_argument(
            f"the buffers of argument {k}", "a tuple of BufferHandles", group)
    if PyTuple_GET_SIZE(group) != num_devices:
        raise _errors.InvalidArgumentError(
            f"argument {k} has {PyTuple_GET_SIZE(group)} buffers for {num_devices} devices")
    for d in range(num_devices):
        item = PyTuple_GET_ITEM(group, d)
        Py_INCREF(<object>item)
        held[d] = item
    return 0


cdef tuple handles_taking(ClientHandle client, NewBuffer* made, Py_ssize_t start,
                          Py_ssize_t step, Py_ssize_t count):
    """The tuple of BufferHandles of ``client`` taking the buffers ``made[start + i *
    step]`` for i < ``count`` (``take_buffer``: those taken set to NULL)."""
    cdef tuple out = PyTuple_New(count)
    cdef Py_ssize_t i
    for i in range(count):
        buffer = take_buffer(client, &made[start + i * step])
        Py_INCREF(buffer)
        PyTuple_SET_ITEM(out, i, buffer)
    return out


cdef void destroy_events(const PJRT_Api* api, PJRT_Event** events, Py_ssize_t count) noexcept nogil:
    """Destroy ``events[0:count]`` (entries not NULL), which no handle owns."""
    cdef PJRT_Event_Destroy_Args args
    cdef Py_ssize_t i
    for i in range(count):
        if events[i] == NULL:
            continue
        args = PJRT_Event_Destroy_Args_new()
        args.event = events[i]
        PJRT_Event_Destroy_quiet(api, &args)


cdef list _checked_lists(object lists, str parameter):
    """``lists`` (a list or tuple of lists or tuples) as a list."""
    if not isinstance(lists, (list, tuple)):
        raise _errors.invalid_argument(parameter, "a list of lists of BufferHandles", lists)
    for i, group in enumerate(lists):
        if not isinstance(group, (list, tuple)):
            raise _errors.invalid_argument(f"{parameter}[{i}]", "a list of BufferHandles", group)
    return lists if type(lists) is list else list(lists)


cdef frozenset _NO_INDICES = frozenset()


cdef tuple _execute_options(launch_id, non_donatable, execute_device, donated):
    """The checked ``(launch_id, non_donatable, execute_device, donated)`` of an execute
    (the defaults pass without a call)."""
    if type(launch_id) is not int or not -2**31 <= launch_id < 2**31:
        launch_id = _errors.check_int(launch_id, "launch_id", -2**31, 2**31 - 1)
    if execute_device is not None and not isinstance(execute_device, DeviceHandle):
        raise _errors.invalid_argument("execute_device", "a DeviceHandle or None", execute_device)
    if not (type(non_donatable) is tuple and not non_donatable):
        non_donatable = tuple(_indices(non_donatable, "non_donatable_input_indices"))
    if type(donated) is frozenset or (type(donated) is tuple and not donated):
        donated = frozenset(_indices(donated, "donated_input_indices")) if donated else _NO_INDICES
    else:
        donated = frozenset(_indices(donated, "donated_input_indices"))
    return launch_id, non_donatable, execute_device, donated


cdef list _indices(values, str name):
    """``values`` (a collection of argument indices) sorted, each checked."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise _errors.invalid_argument(name, "a collection of ints", values)
    return sorted({_errors.check_int(v, f"{name} entry", 0, 2**63 - 1) for v in values})


cdef int refuse_buffer(object item, Py_ssize_t k, Py_ssize_t d) except -1:
    """``_execute``'s refusal of ``item`` as the buffer of argument ``k`` on device ``d``:
    not a BufferHandle, or one of another client."""
    if not isinstance(item, BufferHandle):
        raise _errors.invalid_argument(
            f"the buffer of argument {k} on device {d}", "a BufferHandle", item)
    raise _errors.InvalidArgumentError(f"a buffer of argument {k} belongs to another client")


cdef int refuse_call(ExecutableHandle handle, Py_ssize_t num_devices,
                     Py_ssize_t expected) except -1:
    """``_execute``'s refusal of a call with ``num_devices`` argument lists where the
    executable runs on ``expected`` devices, or without the execute context its host
    callbacks need."""
    if num_devices != expected:
        raise _errors.InvalidArgumentError(
            f"execute got {num_devices} argument lists, the executable runs on {expected} devices")
    raise _errors.FailedPreconditionError(
        f"{handle.name!r} makes host callbacks: it runs only with an execute_context "
        "holding their callables (the plugin crashes on an execute without)")


@cython.no_gc_clear
cdef class ExecutableHandle:
    """Owns a ``PJRT_LoadedExecutable*`` and its ``PJRT_Executable*``."""

    def __init__(self, *args, **kwargs):
        raise TypeError("use ifrtpy._pjrt.compile or deserialize_and_load")

    @staticmethod
    cdef ExecutableHandle _wrap(ClientHandle client, PJRT_LoadedExecutable* ptr):
        cdef const PJRT_Api* api = client.api
        cdef ExecutableHandle self = ExecutableHandle.__new__(ExecutableHandle)
        cdef size_t i
        self.client = client
        self.ptr = ptr
        cdef PJRT_LoadedExecutable_GetExecutable_Args g = PJRT_LoadedExecutable_GetExecutable_Args_new()
        g.loaded_executable = ptr
        PJRT_LoadedExecutable_GetExecutable(api, &g)
        self.executable = g.executable
        cdef PJRT_Executable_Name_Args n = PJRT_Executable_Name_Args_new()
        n.executable = self.executable
        PJRT_Executable_Name(api, &n)
        self.name = to_str(n.executable_name, n.executable_name_size)
        cdef PJRT_Executable_NumOutputs_Args o = PJRT_Executable_NumOutputs_Args_new()
        o.executable = self.executable
        PJRT_Executable_NumOutputs(api, &o)
        self.num_outputs = o.num_outputs
        cdef PJRT_LoadedExecutable_AddressableDevices_Args d = PJRT_LoadedExecutable_AddressableDevices_Args_new()
        d.executable = ptr
        PJRT_LoadedExecutable_AddressableDevices(api, &d)
        self.addressable_devices = tuple(
            client.device_of(d.addressable_devices[i]) for i in range(d.num_addressable_devices))
        return self

    def __dealloc__(self):
        cdef PJRT_Executable_Destroy_Args e
        cdef PJRT_LoadedExecutable_Destroy_Args l
        if self.executable != NULL:
            e = PJRT_Executable_Destroy_Args_new()
            e.executable = self.executable
            self.executable = NULL
            PJRT_Executable_Destroy_quiet(self.client.api, &e)
        if self.ptr != NULL:
            l = PJRT_LoadedExecutable_Destroy_Args_new()
            l.executable = self.ptr
            self.ptr = NULL
            with nogil:
                PJRT_LoadedExecutable_Destroy_quiet(self.client.api, &l)

    @property
    def execute_context(self):
        """The ExecuteContext every execute passes (None: none)."""
        return self._execute_context

    @execute_context.setter
    def execute_context(self, ExecuteContext context):
        if context is not None and context.client is not self.client:
            raise _errors.InvalidArgumentError("the execute context belongs to another client")
        self._execute_context = context

    def execute(self, argument_lists, launch_id=0, non_donatable_input_indices=(),
                execute_device=None, donated_input_indices=()):
        """Run on every addressable device: ``argument_lists[d]`` are device d's
        BufferHandles. With ``execute_device`` (portable executables), one list, run there.

        Returns ``(outputs, events)``, tuples: ``outputs[d][k]`` is output k on device d,
        and one completion event per device. Donated arguments are deleted by the plugin unless
        their index is in ``non_donatable_input_indices``; ``donated_input_indices`` names
        the arguments this call donates (the caller leaves out the non-donatable ones),
        whose buffers read as ``donating`` while pinned.
        Which buffers may be passed (one donated while another execute holds it, one
        another execute donates) is the caller's rule: none is applied here.
        """
        argument_lists = _checked_lists(argument_lists, "argument_lists")
        launch_id, non_donatable, device, donated = _execute_options(
            launch_id, non_donatable_input_indices, execute_device, donated_input_indices)
        return self._execute_tuples(argument_lists, True, len(argument_lists), launch_id,
                                    non_donatable, device, donated, NULL)

    def execute_by_argument(self, arguments, launch_id=0, non_donatable_input_indices=(),
                            execute_device=None, donated_input_indices=()):
        """``execute`` with the buffers grouped the other way round: ``arguments[k]`` holds
        argument k's BufferHandle for each device. Returns ``(outputs, events)``, both
        tuples, with ``outputs[k]`` a tuple of output k's BufferHandle on each device."""
        arguments = _checked_lists(arguments, "arguments")
        launch_id, non_donatable, device, donated = _execute_options(
            launch_id, non_donatable_input_indices, execute_device, donated_input_indices)
        cdef Py_ssize_t num_devices = 1 if device is not None else len(self.addressable_devices)
        return self._execute_tuples(arguments, False, num_devices, launch_id, non_donatable,
                                    device, donated, NULL)

    cdef tuple _execute_tuples(self, list groups, bint by_device, Py_ssize_t num_devices,
                               int launch_id, tuple non_donatable_input_indices,
                               DeviceHandle execute_device, frozenset donated,
                               admit_buffer admit):
        """``_execute`` of ``groups`` (lists or tuples of BufferHandles: device d's
        (``by_device``) or argument k's on each device) returning ``(outputs, events)``,
        both tuples, the outputs grouped as the arguments are. Each group is copied to a
        tuple first (a tuple as it is): what a subclass's own code gives, before the
        execute; the execute reads the copies."""
        cdef Py_ssize_t num_args, num_outputs = self.num_outputs, k, d
        cdef PyObject* small_held[SMALL]
        cdef NewBuffer small_results[SMALL]
        cdef PyObject** held = small_held
        cdef NewBuffer* results = small_results
        cdef PyObject* done = NULL
        cdef Py_ssize_t num_held = 0, num_results = 0
        cdef list copies = [tuple(group) for group in groups]
        if by_device:  # argument k's buffers, one per device
            num_args = len(copies[0]) if copies else 0
            for d, group in enumerate(copies):
                if len(<tuple>group) != num_args:
                    raise _errors.InvalidArgumentError(
                        f"argument list {d} has {len(<tuple>group)} buffers, list 0 has {num_args}")
            arguments = [tuple([(<tuple>group)[k] for group in copies]) for k in range(num_args)]
        else:
            arguments = copies
            num_args = len(arguments)
        try:
            held = <PyObject**>stack_or_malloc(small_held, sizeof(small_held),
                                    num_args * num_devices * sizeof(PyObject*))
            results = <NewBuffer*>stack_or_malloc(small_results, sizeof(small_results),
                                       num_outputs * num_devices * sizeof(NewBuffer))
            for k in range(num_args):
                hold_buffers(arguments[k], k, num_devices, &held[k * num_devices])
                num_held += num_devices
            self._execute(held, num_args, num_devices, launch_id, non_donatable_input_indices,
                          execute_device, donated, admit, results, &done)
            num_results = num_outputs * num_devices
            events = <tuple>done
            # Output k on device d: results[k * num_devices + d], taken by a handle.
            if by_device:
                outputs = tuple([handles_taking(self.client, results, d, num_devices, num_outputs)
                                 for d in range(num_devices)])
            else:
                outputs = tuple([handles_taking(self.client, results, k * num_devices, 1,
                                                num_devices) for k in range(num_outputs)])
        finally:
            for k in range(num_held):
                Py_XDECREF(held[k])
            destroy_new_buffers(self.client.api, results, num_results)  # those not taken
            if held != small_held:
                free(held)
            if results != small_results:
                free(results)
            Py_XDECREF(done)
        return outputs, events

    cdef int _execute(self, PyObject** buffers, Py_ssize_t num_args, Py_ssize_t num_devices,
                      int launch_id, tuple non_donatable_input_indices,
                      DeviceHandle execute_device, frozenset donated, admit_buffer admit,
                      NewBuffer* outputs, PyObject** done) except -1:
        """The one routine that hands buffers to the plugin, for every execute (``execute``,
        ``execute_by_argument`` and the PjRt backend's launches). ``buffers[k * num_devices
        + d]`` is argument k's BufferHandle on device d (``hold_buffers``), referenced by
        the caller for the call. Each buffer is checked to be a BufferHandle of this client,
        given to ``admit`` (the caller's rule, unless NULL; only a buffer this call donates
        or another execute is donating, ``_donating``) and pinned while the plugin
        takes it, marked ``donating`` where its argument is in ``donated`` (the arguments
        the call donates, as the caller worked them out); the events are owned by handles
        made before the plugin is called, so that nothing can fail once it returned (where
        anything does, the outputs are destroyed). PJRT_LoadedExecutable_Execute is called
        with the GIL released.

        On success ``outputs[k * num_devices + d]`` receives output k's buffer on device d,
        which the caller owns from then on (``take_buffer``, ``destroy_new_buffers``); and
        ``done``, unless NULL, a new reference to the tuple of completion events, one per
        device. Where completion events are asked for (``done``, ``reads_completion`` or an
        execute context, which each event holds until it fires), they are read as the
        plugin returns, the GIL still released: the outputs on a device whose execution had
        completed without an error are marked ready (``NewBuffer.ready``), and events no
        one keeps are destroyed there; those an execute context holds on to are destroyed
        once it is registered on them. On error neither is written."""
        cdef const PJRT_Api* api = self.client.api
        cdef Py_ssize_t num_outputs = self.num_outputs
        cdef Py_ssize_t n_nd = len(non_donatable_input_indices)
        cdef Py_ssize_t expected = (1 if execute_device is not None
                                    else len(self.addressable_devices))
        cdef ExecuteContext context = self._execute_context
        cdef tuple running = None  # a _Running per device, for a program with callbacks
        cdef Py_ssize_t d, i, k
        cdef bint donate
        cdef bint donates = bool(donated)  # else no argument is donated: skip the lookups
        cdef bint completion = done != NULL or self.reads_completion or context is not None
        cdef bint keep_events = done != NULL or context is not None
        cdef bint called, written = False, succeeded = False
        cdef Py_ssize_t num_pinned = 0  # the first buffers, argument by argument
        cdef tuple event_handles = None
        cdef PJRT_ExecuteOptions options
        cdef PJRT_LoadedExecutable_Execute_Args args
        cdef PJRT_Error* error = NULL
        # The call's arrays, in one block of pointer-sized slots (on the stack unless the
        # call is large): the arguments and outputs flat (device d's k-th at d * count +
        # k), the events, each device's lists, whether each fired, the non-donatable
        # indices.
        cdef Py_ssize_t slots = num_devices * (num_args + num_outputs + 4) + n_nd
        cdef void* small[SCRATCH]
        cdef void** scratch = small
        cdef PJRT_Buffer** args_flat
        cdef PJRT_Buffer** out_flat
        cdef PJRT_Event** events
        cdef PJRT_Buffer*** arg_ptrs
        cdef PJRT_Buffer*** out_ptrs
        cdef Py_ssize_t* fired
        cdef int64_t* non_donatable
        if num_devices != expected or (context is None and self.needs_context):
            refuse_call(self, num_devices, expected)
        if context is not None:
            devices = (execute_device,) if execute_device is not None else self.addressable_devices
            running = tuple([_Running(device) for device in devices])
        if slots > SCRATCH:
            scratch = <void**>malloc(slots * sizeof(void*))
            if scratch == NULL:
                raise MemoryError()
        args_flat = <PJRT_Buffer**>scratch
        out_flat = args_flat + num_devices * num_args
        events = <PJRT_Event**>(out_flat + num_devices * num_outputs)
        arg_ptrs = <PJRT_Buffer***>(events + num_devices)
        out_ptrs = arg_ptrs + num_devices
        fired = <Py_ssize_t*>(out_ptrs + num_devices)
        non_donatable = <int64_t*>(fired + num_devices)
        try:
            i = 0
            for k in range(num_args):
                donate = donates and k in donated
                for d in range(num_devices):
                    item = <object>buffers[i]
                    if (not isinstance(item, BufferHandle)
                            or (<BufferHandle>item).client is not self.client):
                        refuse_buffer(item, k, d)
                    if admit != NULL and (donate or (<BufferHandle>item)._donating):
                        admit(<BufferHandle>item, donate, k)
                    pin_for_execute(<BufferHandle>item, donate, k)
                    num_pinned += 1
                    args_flat[d * num_args + k] = (<BufferHandle>item).ptr
                    i += 1
            if done != NULL:
                event_handles = new_event_handles(self.client, num_devices)
            for d in range(num_devices):
                arg_ptrs[d] = &args_flat[d * num_args]
                out_ptrs[d] = &out_flat[d * num_outputs]
                events[d] = NULL
                fired[d] = False
            memset(out_flat, 0, num_devices * num_outputs * sizeof(void*))
            for k in range(n_nd):
                non_donatable[k] = non_donatable_input_indices[k]
            options = PJRT_ExecuteOptions_new()
            options.launch_id = launch_id
            options.non_donatable_input_indices = non_donatable
            options.num_non_donatable_input_indices = n_nd
            if context is not None:
                options.context = context.ptr
            args = PJRT_LoadedExecutable_Execute_Args_new()
            args.executable = self.ptr
            args.options = &options
            args.argument_lists = <PJRT_Buffer* const* const*>arg_ptrs
            args.num_devices = num_devices
            args.num_args = num_args
            args.output_lists = <PJRT_Buffer** const*>out_ptrs
            args.device_complete_events = events if completion else NULL
            if execute_device is not None:
                args.execute_device = execute_device.ptr
            if context is not None:  # only its callbacks run inline, and may be interrupted
                forget_interrupt()
            with nogil:
                called = PJRT_LoadedExecutable_Execute_unlocked(api, &args, &error)
                if called and error == NULL and completion:
                    for d in range(num_devices):
                        fired[d] = fired_without_error(api, events[d])
                    if not keep_events:
                        destroy_events(api, events, num_devices)
            if not called:
                raise_unimplemented(api, b"PJRT_LoadedExecutable_Execute")
            if error != NULL:
                if context is not None and take_interrupt():  # Ctrl-C in a callback run inline
                    drop_error(api, error)
                    raise KeyboardInterrupt
                check(api, error)
            for d in range(num_devices):  # output k on device d: out_flat[d * num_outputs + k]
                for k in range(num_outputs):
                    outputs[k * num_devices + d].ptr = out_flat[d * num_outputs + k]
                    outputs[k * num_devices + d].ready = fired[d]
            written = True
            if context is not None:  # the plugin reads it until the execution completes
                for d in range(num_devices):
                    keep_alive_until(api, events[d], (context, running[d]))
            if done != NULL:
                for d in range(num_devices):
                    (<EventHandle>PyTuple_GET_ITEM(event_handles, d)).ptr = events[d]
                Py_INCREF(event_handles)
                done[0] = <PyObject*>event_handles
            elif keep_events:  # kept only to hold the context until they fire
                destroy_events(api, events, num_devices)
            succeeded = True
            return 0
        finally:
            if written and not succeeded:  # on error nothing is written
                destroy_new_buffers(api, outputs, num_outputs * num_devices)
            i = 0  # the buffers pinned, in the order they were
            for k in range(num_args):
                donate = donates and k in donated
                for d in range(num_devices):
                    if i == num_pinned:
                        break
                    unpin_after_execute(<BufferHandle>buffers[i], donate)
                    i += 1
            if scratch != small:
                free(scratch)

    @property
    def num_replicas(self):
        cdef PJRT_Executable_NumReplicas_Args args = PJRT_Executable_NumReplicas_Args_new()
        args.executable = self.executable
        PJRT_Executable_NumReplicas(self.client.api, &args)
        return args.num_replicas

    @property
    def num_partitions(self):
        cdef PJRT_Executable_NumPartitions_Args args = PJRT_Executable_NumPartitions_Args_new()
        args.executable = self.executable
        PJRT_Executable_NumPartitions(self.client.api, &args)
        return args.num_partitions

    @property
    def size_of_generated_code_in_bytes(self):
        cdef PJRT_Executable_SizeOfGeneratedCodeInBytes_Args args = PJRT_Executable_SizeOfGeneratedCodeInBytes_Args_new()
        args.executable = self.executable
        PJRT_Executable_SizeOfGeneratedCodeInBytes(self.client.api, &args)
        return args.size_in_bytes

    def output_element_types(self):
        """PJRT_Buffer_Type of each output."""
        cdef const PJRT_Api* api = self.client.api
        cdef PJRT_Executable_OutputElementTypes_Args args
        cdef size_t i
        args = PJRT_Executable_OutputElementTypes_Args_new()
        args.executable = self.executable
        PJRT_Executable_OutputElementTypes(api, &args)
        return [<int>args.output_types[i] for i in range(args.num_output_types)]

    def output_dimensions(self):
        """Dims of each output, as tuples."""
        cdef const PJRT_Api* api = self.client.api
        cdef PJRT_Executable_OutputDimensions_Args args
        cdef size_t i, j, offset = 0
        args = PJRT_Executable_OutputDimensions_Args_new()
        args.executable = self.executable
        PJRT_Executable_OutputDimensions(api, &args)
        out = []
        for i in range(args.num_outputs):
            out.append(tuple([args.dims[offset + j] for j in range(args.dim_sizes[i])]))
            offset += args.dim_sizes[i]
        return out

    def output_memory_kinds(self):
        """Memory kind of each output (UnimplementedError on the CPU plugin)."""
        cdef const PJRT_Api* api = self.client.api
        cdef PJRT_Executable_OutputMemoryKinds_Args args
        cdef size_t i
        args = PJRT_Executable_OutputMemoryKinds_Args_new()
        args.executable = self.executable
        PJRT_Executable_OutputMemoryKinds(api, &args)
        return [to_str(args.memory_kinds[i], args.memory_kind_sizes[i]) for i in range(args.num_outputs)]

    def optimized_program(self):
        """``(format, code)`` of the compiled program, e.g. ("hlo", serialized HloModuleProto)."""
        cdef const PJRT_Api* api = self.client.api
        cdef PJRT_Executable_OptimizedProgram_Args args
        cdef PJRT_Program program = PJRT_Program_new()
        args = PJRT_Executable_OptimizedProgram_Args_new()
        args.executable = self.executable
        args.program = &program
        PJRT_Executable_OptimizedProgram(api, &args)  # first call: the size
        code = bytearray(program.code_size)
        cdef char* data = code
        program.code = data
        PJRT_Executable_OptimizedProgram(api, &args)
        return to_str(program.format, program.format_size), bytes(code)

    def fingerprint(self):
        cdef const PJRT_Api* api = self.client.api
        cdef PJRT_Executable_Fingerprint_Args args = PJRT_Executable_Fingerprint_Args_new()
        args.executable = self.executable
        PJRT_Executable_Fingerprint(api, &args)
        return to_str(args.executable_fingerprint, args.executable_fingerprint_size)

    def serialize(self):
        """The plugin's serialized executable, for ``deserialize_and_load`` with the same
        plugin (unsealed: the PjRt backend seals it, ``ifrtpy.backends.pjrt.seal``)."""
        cdef const PJRT_Api* api = self.client.api
        cdef PJRT_Executable_Serialize_Args args = PJRT_Executable_Serialize_Args_new()
        args.executable = self.executable
        PJRT_Executable_Serialize(api, &args)
        try:
            payload = args.serialized_bytes[:args.serialized_bytes_size]
        finally:
            if args.serialized_executable_deleter != NULL:
                args.serialized_executable_deleter(args.serialized_executable)
        return payload

    def compiled_memory_stats(self):
        cdef const PJRT_Api* api = self.client.api
        cdef PJRT_Executable_GetCompiledMemoryStats_Args a = PJRT_Executable_GetCompiledMemoryStats_Args_new()
        a.executable = self.executable
        PJRT_Executable_GetCompiledMemoryStats(api, &a)
        return {
            "generated_code_size_in_bytes": a.generated_code_size_in_bytes,
            "argument_size_in_bytes": a.argument_size_in_bytes,
            "output_size_in_bytes": a.output_size_in_bytes,
            "alias_size_in_bytes": a.alias_size_in_bytes,
            "temp_size_in_bytes": a.temp_size_in_bytes,
            "host_generated_code_size_in_bytes": a.host_generated_code_size_in_bytes,
            "host_argument_size_in_bytes": a.host_argument_size_in_bytes,
            "host_output_size_in_bytes": a.host_output_size_in_bytes,
            "host_alias_size_in_bytes": a.host_alias_size_in_bytes,
            "host_temp_size_in_bytes": a.host_temp_size_in_bytes,
            "peak_memory_in_bytes": a.peak_memory_in_bytes,
        }

    def cost_analysis(self):
        cdef const PJRT_Api* api = self.client.api
        cdef PJRT_Executable_GetCostAnalysis_Args args = PJRT_Executable_GetCostAnalysis_Args_new()
        args.executable = self.executable
        PJRT_Executable_GetCostAnalysis(api, &args)
        return named_values_to_dict(args.properties, args.num_properties)

    def delete(self):
        cdef PJRT_LoadedExecutable_Delete_Args args = PJRT_LoadedExecutable_Delete_Args_new()
        args.executable = self.ptr
        PJRT_LoadedExecutable_Delete(self.client.api, &args)

    def is_deleted(self):
        cdef PJRT_LoadedExecutable_IsDeleted_Args args = PJRT_LoadedExecutable_IsDeleted_Args_new()
        args.executable = self.ptr
        PJRT_LoadedExecutable_IsDeleted(self.client.api, &args)
        return args.is_deleted

    def __repr__(self):
        return f"<ExecutableHandle {self.name!r} on {len(self.addressable_devices)} devices>"
