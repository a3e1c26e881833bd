# cython: language_level=3, binding=True, embedsignature=True
"""The launch of every execute of the PjRt backend, in C: ``ExecutableCore``, the fields of
every PjrtLoadedExecutable and its ``execute``.

An execute is checked in Python (the contract, ``ifrtpy.execute_checks``) and launched
here, after the rules of a launch (the layout rule, for checked calls; the donation rules;
the limit of executes nested through host callbacks), reading the executable's launch plan
(``launch_plan``) and its arguments' fields without Python attribute lookups (their
storage: ``ifrtpy.backends.pjrt._array_storage``); a call whose arguments are of the kinds
of a checked call is launched without the checks (``ifrtpy.backends._array_fields``).
"""

cimport cython
from cpython.list cimport PyList_Append, PyList_GET_SIZE
from cpython.object cimport PyObject, PyTypeObject, Py_TYPE
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.sequence cimport PySequence_Fast_GET_SIZE, PySequence_Fast_ITEMS
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.contextvars cimport get_value
from libc.stdlib cimport free

from ifrtpy._pjrt._buffer cimport (BufferHandle, NewBuffer, atomic_load, destroy_new_buffers,
                                   release_buffer)
from ifrtpy._pjrt._client cimport ClientHandle, DeviceHandle
from ifrtpy._pjrt._executable cimport (ExecutableHandle, callback_executions, handles_taking,
                                      hold_buffers, stack_or_malloc)
from ifrtpy._pjrt._host_callback cimport in_host_callback
from ifrtpy._execute_result cimport ExecuteResult, Outputs, new_outputs
from ifrtpy.backends._array_fields cimport CheckedKinds, admits, call_arguments, new_output
from ifrtpy.backends.pjrt._array_storage cimport ArrayCore
from ifrtpy.array_plans import canonical_kind as _canonical_kind
from ifrtpy.executable import ExecuteOptions
from ifrtpy.executable import keyword_arguments_error as _keyword_arguments_error
from ifrtpy.execute_checks import donated_arguments as _donated_arguments
from ifrtpy import errors as _errors
from ifrtpy.backends.pjrt.events import future_of_events
from ifrtpy.user_context import ACTIVE as _user_context

DEF SMALL = 8  # arguments and outputs of an execute kept on the stack


cdef extern from *:
    """
    /* exe(...) by vectorcall (PEP 590): the positional arguments read where the caller
       keeps them, no tuple or keywords dict made. ExecutableCore's instances hold the
       function (``call``, at ifrtpy_call_offset); a type whose tp_call is
       ExecutableCore's (ExecutableCore, and its Python subclasses, which Python 3.11 does
       not let inherit vectorcall) is marked to use it when its first instance is made. A
       type whose __call__ was changed since is called through its tp_call. */
    typedef PyObject* (*ifrtpy_vectorcall)(PyObject*, PyObject**, size_t, PyObject*);
    static Py_ssize_t ifrtpy_call_offset = 0;
    static ternaryfunc ifrtpy_core_call = NULL;

    static int ifrtpy_calls_by_vector(PyTypeObject* type) {
        return type->tp_call == ifrtpy_core_call;
    }

    /* ExecutableCore's own: where its instances keep the function, and its tp_call. */
    static void ifrtpy_call_by_vector_init(PyTypeObject* core, Py_ssize_t offset) {
        ifrtpy_call_offset = offset;
        ifrtpy_core_call = core->tp_call;
    }

    static void ifrtpy_call_by_vector(PyTypeObject* type) {
        if (type->tp_call == ifrtpy_core_call && ifrtpy_call_offset > 0
                && !(type->tp_flags & Py_TPFLAGS_HAVE_VECTORCALL)) {
            type->tp_vectorcall_offset = ifrtpy_call_offset;
            type->tp_flags |= Py_TPFLAGS_HAVE_VECTORCALL;
        }
    }

    /* A vectorcall's arguments as tp_call takes them: a tuple and a dict (NULL: none). */
    static PyObject* ifrtpy_call_through_tp_call(PyObject* self, PyObject* const* args,
                                                 Py_ssize_t nargs, PyObject* kwnames) {
        PyObject *tuple, *dict = NULL, *result;
        Py_ssize_t i, nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
        tuple = PyTuple_New(nargs);
        if (tuple == NULL)
            return NULL;
        for (i = 0; i < nargs; i++) {
            Py_INCREF(args[i]);
            PyTuple_SET_ITEM(tuple, i, args[i]);
        }
        if (nkw > 0) {
            dict = PyDict_New();
            for (i = 0; dict != NULL && i < nkw; i++) {
                if (PyDict_SetItem(dict, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0)
                    Py_CLEAR(dict);
            }
            if (dict == NULL) {
                Py_DECREF(tuple);
                return NULL;
            }
        }
        result = Py_TYPE(self)->tp_call(self, tuple, dict);
        Py_DECREF(tuple);
        Py_XDECREF(dict);
        return result;
    }
    """
    ctypedef object (*ifrtpy_vectorcall)(object, PyObject**, size_t, PyObject*)
    void ifrtpy_call_by_vector_init(PyTypeObject* core, Py_ssize_t offset)
    bint ifrtpy_calls_by_vector(PyTypeObject* type)
    void ifrtpy_call_by_vector(PyTypeObject* type)
    object ifrtpy_call_through_tp_call(object self, PyObject** args, Py_ssize_t nargs,
                                       PyObject* kwnames)
    Py_ssize_t PyVectorcall_NARGS(size_t nargsf)

cdef object _active_user_context = _user_context  # the ContextVar, read without a lookup


cdef class ExecutableCore:
    """The fields of a PjrtLoadedExecutable and its ``execute``, in C.

    One verb a layer: ``execute`` (and ``exe(...)``) is the interface's (PjrtLoadedExecutable
    binds these two by name, so that neither is picked by the method order); this
    backend launches (``_launch``, ``_launch_arrays``); ``_pjrt`` executes
    (``ExecutableHandle._execute``). A call is checked (the interface's contract,
    ``_execute_contract``) and launched (``_launch``: the layout rule, ``_check_layouts``,
    then ``_launch_arrays``), unless its arguments are of the kinds of a checked call
    (``CheckedKinds``, kept where the launch plan allows): that call is launched without
    checks (``_repeat``, ``ifrtpy.backends._array_fields``). Every call is launched by ``_launch_arrays``: its arguments'
    buffers handed to ``_pjrt`` after the backend's rules, the donated arguments read as
    deleted, the outputs made (``_new_outputs``, ``_fill_outputs``). The launch plan (``_plan``) is read here,
    never worked out; the arguments a call donates are the contract's
    (``execute_checks.donated_arguments``). ``exe(...)`` is called by vectorcall
    (``_call``): its arguments are read where the caller keeps them.
    """

    cdef public object _client
    cdef public ExecutableHandle _handle
    cdef public object _devices
    cdef public bint _deleted
    cdef object plan
    cdef frozenset donated  # the plan's: the parameters the program donates
    cdef object effects  # the plan's OrderedEffects, or None
    cdef CheckedKinds kinds  # those of the last checked call that may repeat; None: none yet
    cdef Py_ssize_t max_executions  # per device, of executes inside callbacks; 0: no limit
    cdef object array_type
    cdef ifrtpy_vectorcall call  # exe(...) by vectorcall (see ifrtpy_call_by_vector)
    cdef object __weakref__

    def __cinit__(self, *args, **keywords):
        self.call = _call
        ifrtpy_call_by_vector(Py_TYPE(self))

    @property
    def _plan(self):
        """The launch plan (``ifrtpy.backends.pjrt.launch_plan.LaunchPlan``)."""
        return self.plan

    @_plan.setter
    def _plan(self, plan):
        self.plan = plan
        self.donated = plan.donated
        self.effects = plan.effects
        self.max_executions = plan.max_executions or 0
        self.kinds = None

    @property
    def _array_type(self):
        """The type of the arguments and outputs: ArrayCore or a subclass."""
        return self.array_type

    @_array_type.setter
    def _array_type(self, value):
        if not (isinstance(value, type) and issubclass(value, ArrayCore)):
            raise TypeError(f"_array_type must be a subclass of ArrayCore, got {value!r}")
        self.array_type = value

    @property
    def _checked_kinds(self):
        """The CheckedKinds whose calls are repeated without checks; None until a checked
        call the plan lets repeat."""
        return self.kinds

    @property
    def name(self):
        """The program's name, as the plugin reports it."""
        return self._handle.name

    def devices(self):
        """The devices it runs on; None for a portable executable."""
        return self._devices

    def is_deleted(self):
        """Whether ``delete`` was called."""
        return self._deleted

    def execute(self, args, options=None, devices=None):
        """See :meth:`ifrtpy.LoadedExecutable.execute`."""
        if (devices is None and (options is None or type(options) is ExecuteOptions)
                and (type(args) is list or type(args) is tuple)):
            result = self._repeat(args, options, True)
            if result is not None:
                return result
        return self._launch_checked(self._execute_contract.check(self, args, options, devices),
                                    True)

    def __call__(self, *args, **keywords):
        """``execute(list(args)).outputs``: run with default options."""
        if keywords:
            raise _keyword_arguments_error(self, keywords)
        outputs = self._repeat(args, None, False)
        if outputs is not None:
            return outputs
        return self._launch_checked(
            self._execute_contract.check(self, list(args), None, None), False)

    def _launch(self, call):
        """Launch ``call``, an execute whose contract was checked (a CheckedExecute):
        refuse an argument in another layout than its parameter's (``_check_layouts``), run
        it, and where the plan allows keep its kinds, whose calls are then repeated
        without checks. Returns the ExecuteResult."""
        return self._launch_checked(call, True)

    @cython.final
    cdef object _launch_checked(self, object call, bint as_result):
        """``_launch``, returning the ExecuteResult (``as_result``) or the outputs."""
        cdef list args = <list?>call.args  # the contract's own list: no other thread holds it
        cdef Py_ssize_t k
        cdef ArrayCore array
        for k in range(len(args)):
            array = <ArrayCore?>args[k]  # checked by the contract: an _array_type
        plan = self.plan
        unread = self._check_layouts(args)
        kinds = CheckedKinds(args, tuple([
            (kind[0], kind[1], sharding, layout) for kind, sharding, layout in
            zip(plan.output_types, call.output_shardings, plan.output_layouts_made)]))
        if unread and call.device is None and plan.repeatable:
            self.kinds = kinds
        return self._launch_arrays(PySequence_Fast_ITEMS(args), len(args), call.options,
                                   call.device, kinds, call.donated, as_result)

    @cython.final
    cdef bint _check_layouts(self, list args) except -1:
        """The layout rule of a launch: refuse an argument whose device layout is not its
        parameter's (InvalidArgumentError naming both; PJRT compares only byte sizes, so
        it would be read wrongly). An argument in the default layout of its parameter's
        memory, where that is the parameter's layout, needs no layout read, and on a host
        platform none does; True when none needed one (calls with arguments of these kinds
        then need no check of their layouts)."""
        cdef Py_ssize_t i
        plan = self.plan
        if plan.host:
            return True
        defaults, expected_layouts = plan.parameters_in_default_layouts, plan.parameter_layouts
        unread = True
        for i in range(len(args)):
            arg = args[i]
            if (defaults is not None and defaults[i] and (<ArrayCore>arg)._layout is None
                    and _canonical_kind(arg.sharding) == plan.parameter_memory_kinds[i]):
                continue
            unread = False
            if expected_layouts is None:
                continue  # nothing to compare with
            expected = expected_layouts[i]
            try:
                layout = arg.layout
            except _errors.UnimplementedError:  # the plugin reports no readable layout
                continue
            if layout is not None and (layout.minor_to_major, layout.tiles) != (
                    expected.minor_to_major, expected.tiles):
                raise _errors.InvalidArgumentError(
                    f"argument {i} of {self._handle.name} is in device layout {layout}, the "
                    f"program's parameter {i} takes {expected}: put it in that layout, or "
                    "compile with argument_layouts matching it")
        return unread

    @cython.final
    cdef object _repeat(self, object args, object options, bint as_result):
        """The ExecuteResult (``as_result``) or the outputs of a call whose ``args`` (a list
        or a tuple) are of the checked kinds, run without checks; None for any other."""
        cdef tuple held = call_arguments(self.kinds, args)
        if held is None:
            return None
        return self._repeat_items(PySequence_Fast_ITEMS(held), PySequence_Fast_GET_SIZE(held),
                                  options, as_result)  # the tuple holds them

    @cython.final
    cdef object _repeat_items(self, PyObject** items, Py_ssize_t num_args, object options,
                              bint as_result):
        """``_repeat`` of the arguments ``items[0:num_args]``, held by the caller, as many
        as the checked kinds have."""
        cdef CheckedKinds kinds = self.kinds
        cdef frozenset donated = self.donated
        cdef Py_ssize_t k
        cdef object array_type = self.array_type
        cdef PyObject* item
        for k in range(num_args):
            item = items[k]
            if <PyObject*>Py_TYPE(<object>item) != <PyObject*>array_type:
                return None
            if (<ArrayCore>item)._layout is not None or not admits(kinds, <ArrayCore>item, k):
                return None
        if options is not None:
            donated = _donated_arguments(donated, options)
        return self._launch_arrays(items, num_args, options, None, kinds, donated, as_result)

    @cython.final
    cdef object _launch_arrays(self, PyObject** arrays, Py_ssize_t num_args, object options,
                               object device, CheckedKinds kinds, frozenset donated,
                               bint as_result):
        """The launch of every call, checked or of checked ``kinds``, with ``options`` (an
        ExecuteOptions, or None for the defaults): the buffers of ``arrays[0:num_args]``
        (held by the caller) handed to ``_pjrt`` to run on ``device`` (a portable
        executable's) or the executable's devices, after this backend's rules: the limit
        of executes made inside a host callback (``_check_nested``), and as each buffer is
        pinned, the donation rules (:func:`donation_refusal`); the arguments in
        ``donated`` (the call's, as the contract works them out) given up; the outputs
        made as ``kinds.outputs`` say. From the caller's checks to the plugin no Python
        code runs (reading the options runs none): no other thread changes what the rules
        read. Returns an ExecuteResult (``as_result``) or the outputs.

        Everything that may fail is done before the plugin is called: the output arrays
        are made first (``_new_outputs``) and take their buffers once it returned
        (``_fill_outputs``), so an error (a MemoryError) leaves the donated arguments as
        they were. Only the handles of outputs over several devices are made after it: if
        that fails, the donated arguments' buffers are gone (the plugin consumed them), and
        they read as deleted."""
        cdef int launch_id = 0
        cdef tuple non_donatable = ()
        cdef bint fill_status = False
        if options is not None:
            launch_id = options.launch_id
            if options.non_donatable_input_indices:
                non_donatable = tuple(sorted(options.non_donatable_input_indices))
            fill_status = options.fill_status
        cdef Py_ssize_t num_outputs = PyTuple_GET_SIZE(kinds.outputs), k
        cdef Py_ssize_t num_devices = (1 if device is not None
                                       else len(self._handle.addressable_devices))
        # Argument k's buffer on device d, held[k * num_devices + d] (referenced until the
        # plugin returned), and output k's, results[k * num_devices + d] (owned until an
        # output array takes it); on the stack unless there are many.
        cdef PyObject* small_held[SMALL]
        cdef NewBuffer small_results[SMALL]
        cdef PyObject** held = small_held
        cdef NewBuffer* results = small_results
        cdef Py_ssize_t num_held = 0, num_results = 0
        cdef PyObject* done = NULL
        cdef PyObject* buffer
        cdef DeviceHandle device_handle = None
        cdef ExecuteResult result = None
        cdef Outputs outputs = self._new_outputs(kinds)
        if as_result:
            result = ExecuteResult.__new__(ExecuteResult)
        try:
            held = <PyObject**>stack_or_malloc(small_held, sizeof(small_held),
                                    num_args * num_devices * sizeof(PyObject*))
            results = <NewBuffer*>stack_or_malloc(small_results, sizeof(small_results),
                                       num_outputs * num_devices * sizeof(NewBuffer))
            for k in range(num_args):  # the caller holds the arrays: none is referenced
                if (<ArrayCore>arrays[k])._made.ptr != NULL:
                    (<ArrayCore>arrays[k])._only_buffer()
                buffer = <PyObject*>(<ArrayCore>arrays[k])._buffer
                if buffer != <PyObject*>None and num_devices == 1:
                    Py_INCREF(<object>buffer)
                    held[k] = buffer
                else:
                    hold_buffers((<ArrayCore>arrays[k])._buffers, k, num_devices,
                                 &held[k * num_devices])
                num_held += num_devices
            if self.effects is None:
                if device is not None:
                    device_handle = device._handle
                if self.max_executions and in_host_callback():
                    self._check_nested(device_handle)
                self._handle._execute(held, num_args, num_devices, launch_id, non_donatable,
                                      device_handle, donated, _admit, results,
                                      &done if fill_status else NULL)
                num_results = num_outputs * num_devices
                events = <tuple>done if fill_status else None
            else:
                events = self._launch_ordered(arrays, num_args, launch_id, non_donatable, device,
                                              donated, results, num_outputs * num_devices)
                num_results = num_outputs * num_devices
            try:
                self._fill_outputs(outputs, results, num_devices)
            finally:
                if donated:  # the plugin consumed their buffers: they read as deleted
                    for k in donated:
                        (<ArrayCore>arrays[k])._deleted = True
            if not as_result:
                return outputs
            result.outputs = outputs
            result.status = future_of_events(events) if fill_status else None
            return result
        finally:
            for k in range(num_held):
                Py_XDECREF(held[k])
            destroy_new_buffers(self._handle.client.api, results, num_results)  # not taken
            Py_XDECREF(done)
            if held != small_held:
                free(held)
            if results != small_results:
                free(results)

    @cython.final
    cdef object _launch_ordered(self, PyObject** arrays, Py_ssize_t num_args, int launch_id,
                                tuple non_donatable, object device, frozenset donated,
                                NewBuffer* results, Py_ssize_t num_results):
        """``_launch_arrays``' launch of a program with ordered effects, through its
        ``effects.OrderedEffects``: output k's buffer on device d written to ``results[k *
        num_devices + d]`` (``num_results`` buffers, all or none, taken from the handles
        the launch made); returns the completion events."""
        cdef Py_ssize_t i
        made, events = self.effects.launch(
            self._launch_buffers, [(<ArrayCore>arrays[k])._buffers for k in range(num_args)],
            launch_id, non_donatable, device, donated,
            [device] if device is not None else self._addressable)
        cdef list items = [item for buffers in made for item in <tuple?>buffers]
        if len(items) != num_results:
            raise AssertionError(f"the launch made {len(items)} output buffers, not {num_results}")
        for i in range(num_results):
            results[i] = release_buffer(<BufferHandle>items[i])  # _execute_tuples' own
        return events

    def _launch_buffers(self, arguments, launch_id, non_donatable, device, donated):
        """``_launch_arrays``' hand-over to ``_pjrt``, of ``arguments`` (a list: argument
        k's buffer on each device; the executable's main parameters, tokens included), on
        DeviceHandle ``device`` or every device, the arguments in ``donated`` given up:
        ``(outputs, events)``, output k's buffers on each device and the completion events.
        For the ordered effects (``effects.OrderedEffects.launch``)."""
        cdef ExecutableHandle handle = self._handle
        if self.max_executions and in_host_callback():
            self._check_nested(device)
        return handle._execute_tuples(
            <list?>arguments, False, 1 if device is not None else len(handle.addressable_devices),
            launch_id, tuple(non_donatable), device, frozenset(donated), _admit)

    @cython.final
    cdef int _check_nested(self, DeviceHandle device) except -1:
        """:func:`nested_execute_refusal` on ``device`` (a portable executable's) or each
        device, for an execute made inside a host callback where the platform's
        executions per device are limited."""
        cdef ExecutableHandle handle = self._handle
        for item in ((device,) if device is not None else handle.addressable_devices):
            error = nested_execute_refusal(handle.name, (<DeviceHandle>item).id,
                                           callback_executions(<DeviceHandle>item),
                                           self.max_executions)
            if error is not None:
                raise error
        return 0

    @cython.final
    cdef Outputs _new_outputs(self, CheckedKinds kinds):
        """The output arrays of a launch of ``kinds``, made before the plugin is called,
        without their buffers (``_fill_outputs`` gives them): the one way every execute
        makes them."""
        cdef tuple specs = kinds.outputs
        cdef Py_ssize_t num_outputs = PyTuple_GET_SIZE(specs), k
        cdef Outputs outputs = new_outputs()
        cdef object array_type = self.array_type, client = self._client
        cdef ArrayCore array
        context = get_value(_active_user_context)
        for k in range(num_outputs):
            array = <ArrayCore>new_output(kinds, <PyObject*>array_type, k, <PyObject*>client,
                                          <PyObject*>context)
            array._layout = <object>PyTuple_GET_ITEM(<tuple>PyTuple_GET_ITEM(specs, k), 3)
            PyList_Append(outputs, array)  # list's own: Outputs.append would be looked up
        return outputs

    @cython.final
    cdef int _fill_outputs(self, Outputs outputs, NewBuffer* results,
                           Py_ssize_t num_devices) except -1:
        """Output ``k`` of ``outputs`` takes the buffers ``results[k * num_devices:(k + 1) *
        num_devices]``, one per device: its only one as it is (which cannot fail), those of
        several devices by handles (the caller destroys those not taken)."""
        cdef ClientHandle handle_client = self._handle.client
        cdef PyObject** items = PySequence_Fast_ITEMS(outputs)
        cdef Py_ssize_t k
        cdef ArrayCore array
        for k in range(PyList_GET_SIZE(outputs)):
            array = <ArrayCore>items[k]
            if num_devices == 1:
                array._made = results[k]
                results[k].ptr = NULL
                Py_INCREF(handle_client)
                array._made_client = <PyObject*>handle_client
            else:
                array._shards = handles_taking(handle_client, results, k * num_devices, 1,
                                               num_devices)
        return 0


cdef object _call(object self, PyObject** args, size_t nargsf, PyObject* kwnames):
    """``ExecutableCore.__call__`` by vectorcall: ``exe(a, b)`` with its arguments read in
    place; a call with keywords, or to a type whose ``__call__`` was changed, goes through
    the type's ``tp_call``."""
    cdef Py_ssize_t nargs = PyVectorcall_NARGS(nargsf)
    cdef PyObject* kinds
    if (kwnames != NULL and PyTuple_GET_SIZE(<tuple>kwnames)) or not ifrtpy_calls_by_vector(
            Py_TYPE(self)):
        return ifrtpy_call_through_tp_call(self, args, nargs, kwnames)
    kinds = <PyObject*>(<ExecutableCore>self).kinds  # read, not kept: no code runs meanwhile
    if kinds != <PyObject*>None and nargs == PyTuple_GET_SIZE((<CheckedKinds>kinds).arguments):
        outputs = (<ExecutableCore>self)._repeat_items(args, nargs, None, False)
        if outputs is not None:
            return outputs
    core = <ExecutableCore>self
    return core._launch_checked(core._execute_contract.check(
        core, [<object>args[k] for k in range(nargs)], None, None), False)


cdef int _init_call() except -1:
    """Let ExecutableCore (and its subclasses) be called by vectorcall (``_call``)."""
    cdef ExecutableCore probe = ExecutableCore.__new__(ExecutableCore)
    ifrtpy_call_by_vector_init(<PyTypeObject*>ExecutableCore,
                               <char*>&probe.call - <char*><PyObject*>probe)
    ifrtpy_call_by_vector(<PyTypeObject*>ExecutableCore)
    return 0


_init_call()


# -- the rules of a launch ------------------------------------------------------------------

cpdef object donation_refusal(Py_ssize_t argument, bint donate, Py_ssize_t pins,
                              bint donating, bint read_only, Py_ssize_t exports):
    """The error of handing the plugin a buffer of argument ``argument`` for an execute that
    donates it (``donate``) or not, where ``pins`` executes hand it to the plugin now,
    ``donating`` if one of them donates it, ``read_only`` if it views memory its DLPack
    producer marked read-only, ``exports`` the DLPack exports and NumPy views alive; None
    where it may be handed over. A multi-device execute whose buffer another execute
    donates meanwhile would fail on some devices after others started, leaving their
    outputs waiting forever; a donated buffer is written (or freed) under whoever reads it."""
    if donating:
        return _errors.InvalidArgumentError(
            f"argument {argument} is being donated (by an execute on another thread, or by "
            "another argument of this one)")
    if not donate:
        return None
    if read_only:
        return _errors.InvalidArgumentError(
            f"argument {argument} views memory its DLPack producer marked read-only: it "
            "cannot be donated (list it in the execute's non_donatable_input_indices)")
    if pins:
        return _errors.InvalidArgumentError(
            f"argument {argument} cannot be donated: an execute on another thread (or another "
            "argument of this one) is using it")
    if exports:
        return _errors.FailedPreconditionError(
            f"argument {argument} is donated, but DLPack exports or NumPy views of it are "
            "alive: drop them first, or list the argument in "
            "ExecuteOptions.non_donatable_input_indices")
    return None


cdef int _admit(BufferHandle buffer, bint donate, Py_ssize_t argument) except -1:
    """:func:`donation_refusal` of ``buffer`` as ``_pjrt`` is about to pin it (``_pjrt``
    asks only about a buffer that is donated: the rules refuse no other)."""
    error = donation_refusal(argument, donate, buffer._pins, buffer._donating, buffer._read_only,
                             atomic_load(&buffer.exports))
    if error is not None:
        raise error
    return 0


cpdef object nested_execute_refusal(str name, Py_ssize_t device_id, Py_ssize_t running,
                                    Py_ssize_t limit):
    """The error of an execute of ``name`` made inside a host callback while ``running``
    executions of programs with host callbacks are in flight on device ``device_id``,
    where the platform runs at most ``limit`` executions per device at once
    (:mod:`.execute_limits`): the plugin would hold this one until one of them completes,
    and they wait for it. ResourceExhaustedError at the limit; None below it."""
    if running < limit:
        return None
    return _errors.ResourceExhaustedError(
        f"execute of {name!r} inside a host callback refused: {running} executions of "
        f"programs with host callbacks are in flight on device {device_id}, and this "
        f"platform's plugin runs at most {limit} executions per device at once; this one "
        "would wait for them to complete while they wait for it (executes nested "
        f"{limit} deep through callbacks, or that many threads whose callbacks execute on "
        "one device)")
