"""Where a process finds its job when :func:`ifrtpy.distributed.initialize` is not told:
in the variables its launcher set.

:func:`resolve` fills each of ``coordinator_address``, ``num_processes`` and
``process_id`` that is not given from the first of:

1. ``IFRTPY_COORDINATOR_ADDRESS``, ``IFRTPY_NUM_PROCESSES``, ``IFRTPY_PROCESS_ID``, each on
   its own (``python -m ifrtpy launch`` sets all three);
2. the first launcher found, in this order:

   * Open MPI's ``mpirun`` (ORTE's ``OMPI_MCA_orte_hnp_uri``, or PRRTE's
     ``PRTE_LAUNCHED=1``). It comes before SLURM: ``mpirun`` inside a Slurm allocation
     starts its daemons with ``srun``, so its ranks inherit the daemons' SLURM step
     variables, whose ``SLURM_PROCID`` is a daemon's and not the rank's (jax checks in
     this order too);
   * SLURM's ``srun`` (``SLURM_STEP_NODELIST``, which only a job step has: the single
     process of a batch script is not taken for the job);
   * a Kubernetes Indexed Job, or a JobSet's Job (``KUBERNETES_SERVICE_HOST`` and
     ``JOB_COMPLETION_INDEX``).

A port derived from a launcher's variables (as jax derives it) gives way to
``IFRTPY_COORDINATOR_PORT`` (checked even beside an explicit address, which has its own
port). A malformed or inconsistent value raises InvalidArgumentError naming its variable;
so does a number past :data:`MAX_INTEGER` (ports: 65535), and a Slurm host list whose
numbers have more than :data:`HOST_NUMBER_DIGITS` digits or whose names have more than
:data:`HOST_NAME_CHARACTERS` characters. A host list is counted, not expanded: only its
first host is written out. Nothing is read but the environment, the host's name and, in a
Kubernetes pod without ``IFRTPY_NUM_PROCESSES``, the Job's spec from the API server.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ifrtpy.errors import (
    IfrtError, InvalidArgumentError, PermissionDeniedError, UnavailableError,
)

__all__ = ["JobEnvironment", "resolve", "check_address", "expand_hostlist", "VARIABLES",
           "DERIVED_PORTS", "KUBERNETES_PORT", "SERVICE_ACCOUNT_DIR", "MAX_INTEGER",
           "HOST_NUMBER_DIGITS", "HOST_NAME_CHARACTERS", "MAX_EXPANDED_HOSTS"]

#: The range a port derived from a job id falls in (jax's): 61440 + id % 4096.
DERIVED_PORTS = range(61440, 65536)
#: The coordinator's port in a Kubernetes job (jax's).
KUBERNETES_PORT = 55527
#: Where Kubernetes mounts a pod's service account: its token, CA and namespace.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: The largest number a variable may give (a count, an id, a job id): a signed 64-bit
#: integer. Checked on the digits, before ``int()`` (which refuses more than 4300 of them).
MAX_INTEGER = 2**63 - 1
#: The most digits of a number in a Slurm host list, leading zeros included.
HOST_NUMBER_DIGITS = 18
#: The most characters of a host's name (DNS's bound), in a Slurm host list.
HOST_NAME_CHARACTERS = 253
#: The most hosts :func:`expand_hostlist` writes out (at most about 80 MiB of names, 10 MiB
#: of short ones); resolve() only counts them.
MAX_EXPANDED_HOSTS = 1 << 18

#: The fields resolve() fills, with the variable that gives each explicitly.
_EXPLICIT = {"coordinator_address": "IFRTPY_COORDINATOR_ADDRESS",
             "num_processes": "IFRTPY_NUM_PROCESSES", "process_id": "IFRTPY_PROCESS_ID"}

#: Every variable the detection reads.
VARIABLES = (
    *_EXPLICIT.values(), "IFRTPY_LOCAL_PROCESS_ID", "IFRTPY_LOCAL_DEVICE_COUNT",
    "IFRTPY_COORDINATOR_PORT",
    "OMPI_MCA_orte_hnp_uri", "PRTE_LAUNCHED", "PMIX_NAMESPACE", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
    "SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_NODES", "SLURM_STEP_NUM_TASKS",
    "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID",
    "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "JOB_COMPLETION_INDEX", "HOSTNAME",
)

#: What the detection looks for, for the error that says nothing was found.
_LOOKED_FOR = ("Open MPI (OMPI_MCA_orte_hnp_uri, or PRTE_LAUNCHED=1)",
               "SLURM (SLURM_STEP_NODELIST, set in srun's tasks)",
               "Kubernetes (KUBERNETES_SERVICE_HOST and JOB_COMPLETION_INDEX: an Indexed "
               "Job's pods)")


@dataclass(frozen=True)
class JobEnvironment:
    """What a process of a job was told: its coordinator's ``host:port``, the number of
    processes, its own id, its index among the job's processes on this host where the
    launcher says (``SLURM_LOCALID``, ``OMPI_COMM_WORLD_LOCAL_RANK``,
    ``IFRTPY_LOCAL_PROCESS_ID``; else None), its CPU device count for jax's runtime where
    ``IFRTPY_LOCAL_DEVICE_COUNT`` says (``launch --devices-per-process``), and where each
    of the first three came from (``origins``: an argument, or the variables, as errors
    name them)."""

    coordinator_address: str
    num_processes: int
    process_id: int
    local_process_id: int | None = None
    local_device_count: int | None = None
    origins: Mapping[str, str] = field(default_factory=dict)


#: A field found somewhere: (value, where it came from).
_Found = tuple[Any, str]


def resolve(coordinator_address: str | None = None, num_processes: int | None = None,
            process_id: int | None = None, *, environ: Mapping[str, str] | None = None,
            api_timeout_s: float = 10.0) -> JobEnvironment:
    """The job of this process: the arguments given, the rest from ``environ`` (default:
    ``os.environ``) as the module says. InvalidArgumentError naming the variable for a
    malformed or inconsistent value, and listing what was looked for when a field is
    found nowhere. In a Kubernetes pod without ``IFRTPY_NUM_PROCESSES`` the process count
    is the Job's ``spec.parallelism``, read from the API server within ``api_timeout_s``
    (PermissionDeniedError or UnavailableError when it cannot be)."""
    env = os.environ if environ is None else environ
    _port_setting(env)  # checked even where an explicit address leaves it unused
    found: dict[str, _Found] = {}
    for name, value in (("coordinator_address", coordinator_address),
                        ("num_processes", num_processes), ("process_id", process_id)):
        if value is not None:
            if name == "coordinator_address":
                if not isinstance(value, str):
                    raise InvalidArgumentError(
                        f"coordinator_address must be a str 'host:port', got {value!r}")
                value = check_address(value, "coordinator_address")
            elif isinstance(value, bool) or not isinstance(value, int):
                raise InvalidArgumentError(f"{name} must be an int, got {value!r}")
            found[name] = (value, f"the {name} argument")
    for name, variable in _EXPLICIT.items():
        if name not in found and _is_set(env, variable):
            found[name] = (check_address(env[variable], variable)
                           if name == "coordinator_address"
                           else _integer(env, variable, 1 if name == "num_processes" else 0),
                           variable)
    local: _Found | None = ((_integer(env, "IFRTPY_LOCAL_PROCESS_ID"), "IFRTPY_LOCAL_PROCESS_ID")
                            if _is_set(env, "IFRTPY_LOCAL_PROCESS_ID") else None)
    missing = [name for name in _EXPLICIT if name not in found]
    if missing:
        launcher = (_open_mpi(env) or _slurm(env)
                    or _kubernetes(env, "coordinator_address" in missing))
        if launcher is None:
            wanted = " and ".join(f"{name} (or {_EXPLICIT[name]})" for name in missing)
            raise InvalidArgumentError(
                f"initialize() needs {wanted}: not given, and no launcher found (looked for "
                f"{'; '.join(_LOOKED_FOR)}). Start the processes with `python -m ifrtpy "
                "launch -n N -- ...` on one machine, or give them")
        for name in _EXPLICIT:
            if name in launcher:
                found.setdefault(name, launcher[name])
        local = local or launcher.get("local_process_id")
        if "num_processes" not in found:  # Kubernetes: the Job knows
            job = launcher["job_name"][0]
            found["num_processes"] = (_kubernetes_job_size(env, job, api_timeout_s),
                                      f"the spec.parallelism of Job {job!r}")
    (count, count_origin), (pid, pid_origin) = found["num_processes"], found["process_id"]
    if count < 1 or not 0 <= pid < count:
        raise InvalidArgumentError(
            f"need num_processes >= 1 and 0 <= process_id < num_processes, got "
            f"num_processes={count} ({count_origin}) and process_id={pid} ({pid_origin})")
    devices = (_integer(env, "IFRTPY_LOCAL_DEVICE_COUNT", 1)
               if _is_set(env, "IFRTPY_LOCAL_DEVICE_COUNT") else None)
    return JobEnvironment(found["coordinator_address"][0], count, pid,
                          None if local is None else local[0], devices,
                          {name: found[name][1] for name in _EXPLICIT})


# -- values -----------------------------------------------------------------------------------

def _is_set(env: Mapping[str, str], name: str) -> bool:
    return bool(env.get(name, "").strip())


def _integer(env: Mapping[str, str], name: str, low: int = 0, high: int = MAX_INTEGER) -> int:
    """The variable ``name`` as an integer in ``low..high``; InvalidArgumentError naming
    it and the bounds."""
    text = env.get(name)
    if text is None:
        raise InvalidArgumentError(f"{name} is not set")
    value = _number(text, low, high)
    if value is None:
        raise InvalidArgumentError(
            f"{name} must be an integer in {low}..{high}, got {_shown(text)}")
    return value


def _number(text: str, low: int = 0, high: int = MAX_INTEGER) -> int | None:
    """``text`` (decimal digits, spaces around) as an integer in ``low..high``, else None.
    Its digits are counted before any conversion, so no length of text is too long."""
    digits = text.strip()
    if not re.fullmatch(r"[0-9]+", digits):
        return None
    digits = digits.lstrip("0") or "0"
    if len(digits) > len(str(high)) or not low <= int(digits) <= high:
        return None
    return int(digits)


def _shown(text: str, limit: int = 80) -> str:
    """``repr(text)`` for an error message, cut to about ``limit`` characters."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def _below(env: Mapping[str, str], index: str, count: str, low: int = 1) -> tuple[int, int]:
    """The variables ``index`` and ``count`` as integers, the index below the count;
    InvalidArgumentError naming both when it is not."""
    total, value = _integer(env, count, low), _integer(env, index)
    if value >= total:
        raise InvalidArgumentError(
            f"{index}={value} is not below {count}={total}: the variables disagree")
    return value, total


def check_address(address: str, name: str) -> str:
    """``address`` when it is ``host:port`` with a port in 1..65535 (an IPv6 host in
    brackets: ``[::1]:1234``); else InvalidArgumentError naming ``name``."""
    host, sep, port = address.strip().rpartition(":")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if (not sep or not bare or _number(port, 1, 65535) is None
            or any(c in bare for c in "[]/ ") or (":" in bare and bare == host)):
        raise InvalidArgumentError(
            f"{name} must be 'host:port' with a port in 1..65535 (an IPv6 host in brackets), "
            f"got {_shown(address)}")
    return address.strip()


def _address(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets."""
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]:{port}"
    except ValueError:
        pass
    return f"{host}:{port}"


def _port_setting(env: Mapping[str, str]) -> int | None:
    """IFRTPY_COORDINATOR_PORT (a port in 1..65535), or None where it is not set."""
    if not _is_set(env, "IFRTPY_COORDINATOR_PORT"):
        return None
    return _integer(env, "IFRTPY_COORDINATOR_PORT", 1, 65535)


def _port(env: Mapping[str, str], derived: int, how: str) -> tuple[int, str]:
    """The coordinator's port and how it came: IFRTPY_COORDINATOR_PORT when set, else
    ``derived`` (``how`` says from what)."""
    port = _port_setting(env)
    if port is not None:
        return port, "IFRTPY_COORDINATOR_PORT"
    return derived, f"{how} (IFRTPY_COORDINATOR_PORT sets another)"


def _derived_port(job_id: int) -> int:
    return DERIVED_PORTS.start + job_id % len(DERIVED_PORTS)


# -- Open MPI -------------------------------------------------------------------------------

def _open_mpi(env: Mapping[str, str]) -> dict[str, _Found] | None:
    """A rank started by Open MPI's ``mpirun``. The coordinator is on the host ``mpirun``
    runs on (rank 0 must run there): Open MPI <= 4 (ORTE) names it in
    ``OMPI_MCA_orte_hnp_uri`` (``<jobid>.<vpid>;tcp://<addresses>:<port>``: its first
    address; port 61440 + jobid / 4096 % 4096), Open MPI 5 (PRRTE, ``PRTE_LAUNCHED=1``)
    in ``PMIX_NAMESPACE`` (``prterun-<host>-<pid>@<n>``; port 61440 + pid % 4096)."""
    if "OMPI_MCA_orte_hnp_uri" in env:
        uri = env["OMPI_MCA_orte_hnp_uri"]
        job_id, host = _orte_uri(uri)
        port = _port(env, _derived_port(job_id // 4096),
                     "port 61440 + (the job id of OMPI_MCA_orte_hnp_uri) / 4096 % 4096")
        where = "OMPI_MCA_orte_hnp_uri's first address"
    elif env.get("PRTE_LAUNCHED") == "1":
        namespace = env.get("PMIX_NAMESPACE", "")
        parsed = re.fullmatch(r"[^-@]+-(.+)-([0-9]+)@[0-9]+", namespace)
        pid = _number(parsed.group(2)) if parsed else None
        if parsed is None or pid is None:
            raise InvalidArgumentError(
                f"PMIX_NAMESPACE must be PRRTE's '<tool>-<host>-<pid>@<n>' (PRTE_LAUNCHED=1; "
                f"a pid in 0..{MAX_INTEGER}), got {_shown(namespace)}")
        host = parsed.group(1)
        port = _port(env, _derived_port(pid),
                     "port 61440 + (the pid of PMIX_NAMESPACE) % 4096")
        where = "PMIX_NAMESPACE's host"
    else:
        return None
    rank, size = _below(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")
    found: dict[str, _Found] = {
        "coordinator_address": (_address(host, port[0]), f"Open MPI: {where}, {port[1]}"),
        "num_processes": (size, "OMPI_COMM_WORLD_SIZE"),
        "process_id": (rank, "OMPI_COMM_WORLD_RANK"),
    }
    if _is_set(env, "OMPI_COMM_WORLD_LOCAL_RANK"):
        found["local_process_id"] = (_integer(env, "OMPI_COMM_WORLD_LOCAL_RANK"),
                                     "OMPI_COMM_WORLD_LOCAL_RANK")
    return found


def _orte_uri(uri: str) -> tuple[int, str]:
    """(job id, first address) of ORTE's HNP URI, e.g.
    ``1531576320.0;tcp://10.96.0.1,10.148.0.1:34911`` or
    ``1314521088.0;tcp6://[fe80::b9b,2620:10d::3000:2]:43370``."""
    parsed = re.fullmatch(r"([0-9]+)(?:\.[0-9]+)?;(.*)", uri.strip())
    first = re.search(r"tcp://([^,:;/\[\]]+)[,:]|tcp6://\[([^,\]]+)[,\]]",
                      parsed.group(2)) if parsed else None
    host = (first.group(1) or first.group(2)) if first else ""
    job_id = _number(parsed.group(1)) if parsed else None
    if job_id is None or not _is_ip_address(host):
        raise InvalidArgumentError(
            "OMPI_MCA_orte_hnp_uri must be '<jobid>.<vpid>;tcp://<address>,...:<port>' "
            f"(or tcp6://[<address>,...]:<port>; a job id in 0..{MAX_INTEGER}), got "
            f"{_shown(uri)}")
    return job_id, host


def _is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


# -- SLURM ----------------------------------------------------------------------------------

def _slurm(env: Mapping[str, str]) -> dict[str, _Found] | None:
    """A task of an ``srun`` step: the coordinator on the step's first node
    (``SLURM_STEP_NODELIST``), port 61440 + ``SLURM_JOB_ID`` % 4096; the step's task count
    (``SLURM_STEP_NUM_TASKS``, else ``SLURM_NTASKS``), ``SLURM_PROCID``, ``SLURM_LOCALID``.
    Task 0 runs on the first node with srun's block and cyclic distributions (not
    necessarily with ``--distribution=arbitrary``)."""
    if "SLURM_STEP_NODELIST" not in env:
        return None
    nodes, named = _parse_hostlist(env["SLURM_STEP_NODELIST"], "SLURM_STEP_NODELIST")
    if _is_set(env, "SLURM_STEP_NUM_NODES"):
        count = _integer(env, "SLURM_STEP_NUM_NODES", 1)
        if count != named:
            raise InvalidArgumentError(
                f"SLURM_STEP_NUM_NODES={count} but SLURM_STEP_NODELIST names {named} "
                f"node(s) ({_shown(env['SLURM_STEP_NODELIST'])}): the variables disagree")
    tasks = "SLURM_STEP_NUM_TASKS" if _is_set(env, "SLURM_STEP_NUM_TASKS") else "SLURM_NTASKS"
    task, total = _below(env, "SLURM_PROCID", tasks)
    port = _port(env, _derived_port(_integer(env, "SLURM_JOB_ID")),
                 "port 61440 + SLURM_JOB_ID % 4096")
    found: dict[str, _Found] = {
        "coordinator_address": (_address(_first_host(nodes), port[0]),
                                f"SLURM: the first node of SLURM_STEP_NODELIST, {port[1]}"),
        "num_processes": (total, tasks),
        "process_id": (task, "SLURM_PROCID"),
    }
    if _is_set(env, "SLURM_LOCALID"):
        found["local_process_id"] = (_integer(env, "SLURM_LOCALID"), "SLURM_LOCALID")
    return found


#: A bracketed group of a host list: its ranges (low, high, width: the low bound's digits).
_Group = list[tuple[int, int, int]]
#: A parsed host list: its entries, each a list of parts: a piece of a name, or a group.
_Hostlist = list[list[str | _Group]]


def expand_hostlist(hostlist: str, name: str = "host list") -> list[str]:
    """The hosts of a Slurm host list, in order: comma-separated entries, each a name with
    any number of bracketed groups of numbers and ranges, expanded as a product
    (``node[001-003,007],gpu[1-2]``, ``rack[1-2]-n[01-02]``); a range keeps the width of
    its first bound (``n[08-11]``: ``n08`` .. ``n11``). InvalidArgumentError naming
    ``name`` for a malformed list, a number of more than :data:`HOST_NUMBER_DIGITS`
    digits, a name of more than :data:`HOST_NAME_CHARACTERS` characters, or a list of more
    than :data:`MAX_EXPANDED_HOSTS` hosts."""
    entries, count = _parse_hostlist(hostlist, name)
    if count > MAX_EXPANDED_HOSTS:
        raise InvalidArgumentError(
            f"{name} names {count} hosts, and expand_hostlist writes out at most "
            f"{MAX_EXPANDED_HOSTS}: {_shown(hostlist)}")
    hosts: list[str] = []
    for parts in entries:
        names = [""]
        for part in parts:
            choices = [part] if isinstance(part, str) else [
                str(n).zfill(width) for low, high, width in part for n in range(low, high + 1)]
            names = [prefix + choice for prefix in names for choice in choices]
        hosts.extend(names)
    return hosts


def _parse_hostlist(hostlist: str, name: str) -> tuple[_Hostlist, int]:
    """The entries of a Slurm host list (see :func:`expand_hostlist`), none expanded, and
    how many hosts it names (at most :data:`MAX_INTEGER`)."""
    def bad(why: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"{name} is not a Slurm host list ({why}): {_shown(hostlist)}")

    texts, depth, start = [], 0, 0
    for i, char in enumerate(hostlist + ","):
        if char in "[]":
            depth += 1 if char == "[" else -1
            if depth not in (0, 1):
                raise bad("unbalanced or nested brackets")
        elif char == "," and depth == 0:
            texts.append(hostlist[start:i])
            start = i + 1
    if depth:
        raise bad("unbalanced brackets")
    entries: _Hostlist = []
    for entry in texts:
        if not entry or any(c.isspace() for c in entry):
            raise bad("an empty entry, or a space")
        parts = [_parse_group(part, bad) if k % 2 else part
                 for k, part in enumerate(re.split(r"\[([^\]]*)\]", entry))]
        if _longest_name(parts) > HOST_NAME_CHARACTERS:
            raise bad(f"a name of more than {HOST_NAME_CHARACTERS} characters")
        entries.append(parts)
    count = _host_count(entries)
    if count > MAX_INTEGER:
        raise bad(f"it names more than {MAX_INTEGER} hosts")
    return entries, count


def _parse_group(group: str, bad: Callable[[str], InvalidArgumentError]) -> _Group:
    """The ranges of a bracketed group: (low, high, width) for each number or range."""
    ranges = []
    for item in group.split(","):
        bounds = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", item)
        if not bounds:
            raise bad(f"{_shown(item, 40)} is not a number or a range")
        if any(len(b) > HOST_NUMBER_DIGITS for b in bounds.groups("")):
            raise bad(f"a number has more than {HOST_NUMBER_DIGITS} digits")
        low, high = int(bounds.group(1)), int(bounds.group(2) or bounds.group(1))
        if high < low:
            raise bad(f"the range {item!r} goes down")
        ranges.append((low, high, len(bounds.group(1))))
    return ranges


def _host_count(entries: _Hostlist) -> int:
    """How many hosts a parsed host list names (a product per entry, not expanded), or
    MAX_INTEGER + 1 where it names more (so that no count grows without bound)."""
    total = 0
    for parts in entries:
        count = 1
        for part in parts:
            if not isinstance(part, str):
                count = min(count * sum(high - low + 1 for low, high, _ in part), MAX_INTEGER + 1)
        total = min(total + count, MAX_INTEGER + 1)
    return total


def _longest_name(parts: list[str | _Group]) -> int:
    """The length of the longest name an entry's parts make."""
    return sum(len(part) if isinstance(part, str) else
               max(max(width, len(str(high))) for _, high, width in part) for part in parts)


def _first_host(entries: _Hostlist) -> str:
    """The first host a parsed host list names."""
    return "".join(part if isinstance(part, str) else str(part[0][0]).zfill(part[0][2])
                   for part in entries[0])


# -- Kubernetes -----------------------------------------------------------------------------

def _kubernetes(env: Mapping[str, str], want_address: bool) -> dict[str, _Found] | None:
    """A pod of an Indexed Job (a JobSet's Jobs are Indexed Jobs): the Job controller names
    it ``<job>-<index>`` and sets ``JOB_COMPLETION_INDEX``; with a headless service as
    its ``subdomain`` (a JobSet's default: the JobSet's name) its FQDN is
    ``<job>-<index>.<subdomain>.<namespace>.svc...``. The coordinator is pod 0:
    ``<job>-0.<subdomain>``, port 55527 (looked for only when ``want_address``). The count
    is left to resolve() (``job_name`` says which Job)."""
    if "KUBERNETES_SERVICE_HOST" not in env or "JOB_COMPLETION_INDEX" not in env:
        return None
    index = _integer(env, "JOB_COMPLETION_INDEX")
    hostname = env.get("HOSTNAME") or socket.gethostname()
    job, _, suffix = hostname.rpartition("-")
    if not job or suffix != str(index):
        raise InvalidArgumentError(
            f"the pod's name (HOSTNAME={hostname!r}) is not '<job>-{index}' as "
            f"JOB_COMPLETION_INDEX={index} says: is this pod an Indexed Job's?")
    found: dict[str, _Found] = {"process_id": (index, "JOB_COMPLETION_INDEX"),
                                "job_name": (job, "HOSTNAME")}
    if not want_address:
        return found
    fqdn = socket.getfqdn(hostname)
    labels = fqdn.split(".")
    if labels[0] != hostname or len(labels) < 2:
        raise InvalidArgumentError(
            f"the pod {hostname!r} has no subdomain (its FQDN is {fqdn!r}), so the other "
            "pods cannot reach pod 0 by name: set the pod template's spec.subdomain to a "
            "headless service (clusterIP: None) that selects the Job's pods, or set "
            f"IFRTPY_COORDINATOR_ADDRESS (e.g. {job}-0.<service>:{KUBERNETES_PORT})")
    port = _port(env, KUBERNETES_PORT, f"port {KUBERNETES_PORT}")
    found["coordinator_address"] = (
        f"{job}-0.{labels[1]}:{port[0]}",
        f"Kubernetes: pod 0 of the Job named in HOSTNAME, on the pod's subdomain, {port[1]}")
    return found


def _kubernetes_job_size(env: Mapping[str, str], job: str, timeout_s: float) -> int:
    """The Job's ``spec.parallelism`` (which must equal its ``spec.completions``: all its
    pods run at once), read from the API server with the pod's service account (RBAC:
    ``get`` on ``jobs``)."""
    import json
    import ssl
    import urllib.error
    import urllib.request

    advice = "set IFRTPY_NUM_PROCESSES to the Job's parallelism in the pod template"
    try:
        with open(os.path.join(SERVICE_ACCOUNT_DIR, "token")) as f:
            token = f.read().strip()
        with open(os.path.join(SERVICE_ACCOUNT_DIR, "namespace")) as f:
            namespace = f.read().strip()
        context = ssl.create_default_context(cafile=os.path.join(SERVICE_ACCOUNT_DIR, "ca.crt"))
    except OSError as e:
        raise InvalidArgumentError(
            f"the process count of Job {job!r} is unknown: no IFRTPY_NUM_PROCESSES, and no "
            f"service account to ask the API server ({e}): {advice}") from None
    port = _integer(env, "KUBERNETES_SERVICE_PORT", 1, 65535) if _is_set(
        env, "KUBERNETES_SERVICE_PORT") else 443
    host = _address(env["KUBERNETES_SERVICE_HOST"].strip(), port)
    url = f"https://{host}/apis/batch/v1/namespaces/{namespace}/jobs/{job}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                         urllib.request.HTTPSHandler(context=context))
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}",
                                                   "Accept": "application/json"})
    try:
        with opener.open(request, timeout=timeout_s) as response:
            spec = json.load(response)["spec"]
        parallelism, completions = int(spec.get("parallelism", 1)), spec.get("completions")
    except urllib.error.HTTPError as e:
        error: IfrtError = (PermissionDeniedError if e.code in (401, 403) else UnavailableError)(
            f"reading Job {job!r} from the API server ({url}) failed: {e.code} {e.reason}; "
            f"grant the pod's service account 'get' on 'jobs' (batch), or {advice}")
        raise error from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UnavailableError(f"reading Job {job!r} from the API server ({url}) failed: {e}; "
                               f"{advice}") from None
    if completions != parallelism:
        raise InvalidArgumentError(
            f"Job {job!r} has parallelism {parallelism} but completions {completions}: the "
            "processes of a job run at once, so they must be equal")
    return parallelism
