"""Cluster detection (ifrtpy.distributed.clusters) against hostile variables: numbers too
long for Python's int() (a clear error naming the variable and the bound, never the
digit-limit ValueError), Slurm host lists naming millions or billions of hosts (counted,
never expanded, by resolve(); expand_hostlist refuses past its bound), and a malformed
IFRTPY_COORDINATOR_PORT beside an explicit address (refused, not ignored).

The huge host lists run in a child process under an address-space limit and a timeout,
so that a regression cannot take the machine."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from ifrtpy import errors
from ifrtpy.distributed import clusters

#: A number with more digits than Python's int() converts (4300 by default).
HUGE = "9" * 5000
#: The same with leading zeros only: its value is 1, its text as long.
ZEROS = "0" * 5000 + "1"

EXPLICIT = {"IFRTPY_COORDINATOR_ADDRESS": "127.0.0.1:47999", "IFRTPY_NUM_PROCESSES": "2",
            "IFRTPY_PROCESS_ID": "0"}
SLURM = {"SLURM_JOB_ID": "5123456", "SLURM_STEP_NODELIST": "gpu[007-008]",
         "SLURM_STEP_NUM_NODES": "2", "SLURM_NTASKS": "4", "SLURM_PROCID": "3",
         "SLURM_LOCALID": "1"}
ORTE = {"OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://10.96.0.1,10.148.0.1:34911",
        "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_RANK": "5",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
PRRTE = {"PRTE_LAUNCHED": "1", "PMIX_NAMESPACE": "prterun-node-18-12345@1",
         "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}
K8S = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
       "JOB_COMPLETION_INDEX": "2", "HOSTNAME": "train-2", "IFRTPY_NUM_PROCESSES": "4",
       "IFRTPY_COORDINATOR_ADDRESS": "train-0.svc:55527"}


# -- numbers past int()'s digit limit: a clear error naming the variable and the bound -------

@pytest.mark.parametrize("variable, env", [
    ("IFRTPY_NUM_PROCESSES", {**EXPLICIT, "IFRTPY_NUM_PROCESSES": HUGE}),
    ("IFRTPY_PROCESS_ID", {**EXPLICIT, "IFRTPY_PROCESS_ID": HUGE}),
    ("IFRTPY_LOCAL_PROCESS_ID", {**EXPLICIT, "IFRTPY_LOCAL_PROCESS_ID": HUGE}),
    ("IFRTPY_LOCAL_DEVICE_COUNT", {**EXPLICIT, "IFRTPY_LOCAL_DEVICE_COUNT": HUGE}),
    ("IFRTPY_COORDINATOR_ADDRESS", {**EXPLICIT, "IFRTPY_COORDINATOR_ADDRESS": "h:" + HUGE}),
    ("IFRTPY_COORDINATOR_PORT", {**SLURM, "IFRTPY_COORDINATOR_PORT": HUGE}),
    ("IFRTPY_COORDINATOR_PORT", {**EXPLICIT, "IFRTPY_COORDINATOR_PORT": HUGE}),
    ("SLURM_JOB_ID", {**SLURM, "SLURM_JOB_ID": HUGE}),
    ("SLURM_NTASKS", {**SLURM, "SLURM_NTASKS": HUGE}),
    ("SLURM_PROCID", {**SLURM, "SLURM_PROCID": HUGE}),
    ("SLURM_LOCALID", {**SLURM, "SLURM_LOCALID": HUGE}),
    ("SLURM_STEP_NUM_NODES", {**SLURM, "SLURM_STEP_NUM_NODES": HUGE}),
    ("SLURM_STEP_NODELIST", {**SLURM, "SLURM_STEP_NODELIST": f"n[{HUGE}]"}),
    ("SLURM_STEP_NODELIST", {**SLURM, "SLURM_STEP_NODELIST": f"n[0-{HUGE}]"}),
    ("SLURM_STEP_NODELIST", {**SLURM, "SLURM_STEP_NODELIST": f"n[{ZEROS}-2]"}),
    ("OMPI_MCA_orte_hnp_uri", {**ORTE, "OMPI_MCA_orte_hnp_uri": f"{HUGE}.0;tcp://10.0.0.1:1"}),
    ("OMPI_COMM_WORLD_SIZE", {**ORTE, "OMPI_COMM_WORLD_SIZE": HUGE}),
    ("OMPI_COMM_WORLD_LOCAL_RANK", {**ORTE, "OMPI_COMM_WORLD_LOCAL_RANK": HUGE}),
    ("PMIX_NAMESPACE", {**PRRTE, "PMIX_NAMESPACE": f"prterun-node-{HUGE}@1"}),
    ("JOB_COMPLETION_INDEX", {**K8S, "JOB_COMPLETION_INDEX": HUGE}),
], ids=lambda v: v if isinstance(v, str) else "")
def test_a_huge_number_is_refused_naming_its_variable_and_bound(variable, env):
    with pytest.raises(errors.InvalidArgumentError) as e:
        clusters.resolve(environ=env)
    message = str(e.value)
    assert variable in message
    bounds = (str(clusters.MAX_INTEGER), "1..65535", f"{clusters.HOST_NUMBER_DIGITS} digits")
    assert any(bound in message for bound in bounds), message
    assert len(message) < 600  # the 5000 digits are not repeated


def test_a_variable_s_leading_zeros_do_not_count_against_its_bound():
    job = clusters.resolve(environ={**EXPLICIT, "IFRTPY_PROCESS_ID": ZEROS})
    assert job.process_id == 1


def test_a_host_list_s_numbers_have_at_most_so_many_digits():
    digits = clusters.HOST_NUMBER_DIGITS
    widest = "0" * (digits - 1) + "1"
    assert clusters.expand_hostlist(f"n[{widest}-2]") == ["n" + widest, "n" + widest[:-1] + "2"]
    with pytest.raises(errors.InvalidArgumentError, match=f"more than {digits} digits"):
        clusters.expand_hostlist(f"n[0{widest}]")


def test_numbers_at_the_bounds_are_taken():
    job = clusters.resolve(environ={**SLURM, "SLURM_JOB_ID": str(2**63 - 1),
                                    "IFRTPY_COORDINATOR_PORT": "65535"})
    assert job.coordinator_address == "gpu007:65535"
    job = clusters.resolve(environ={**SLURM, "SLURM_JOB_ID": str(2**63 - 1)})
    assert job.coordinator_address == f"gpu007:{61440 + (2**63 - 1) % 4096}"
    with pytest.raises(errors.InvalidArgumentError, match=f"SLURM_JOB_ID.*{2**63 - 1}"):
        clusters.resolve(environ={**SLURM, "SLURM_JOB_ID": str(2**63)})


# -- host lists: counted without being expanded ---------------------------------------------

@pytest.mark.parametrize("hostlist", [
    "node001", "node[001-003,007],gpu[1-2]", "rack[1-2]-n[08-09]", "n[9-11]",
    "a[1-2]b[3,5-6]c,d[07-10]", "[1-3]x",
])
def test_resolve_takes_the_first_host_and_the_count_expand_hostlist_gives(hostlist):
    hosts = clusters.expand_hostlist(hostlist)
    env = {**SLURM, "SLURM_STEP_NODELIST": hostlist, "SLURM_STEP_NUM_NODES": str(len(hosts))}
    assert clusters.resolve(environ=env).coordinator_address == f"{hosts[0]}:{61440 + 5123456 % 4096}"
    env["SLURM_STEP_NUM_NODES"] = str(len(hosts) + 1)
    with pytest.raises(errors.InvalidArgumentError, match=f"names {len(hosts)} node"):
        clusters.resolve(environ=env)


#: A child that resolves the job of the environment given as JSON, under a 1 GiB
#: address-space limit (importing ifrtpy.distributed.clusters takes ~160 MiB).
_BOUNDED_CHILD = textwrap.dedent("""
    import json, resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    from ifrtpy.distributed import clusters
    try:
        if len(sys.argv) > 2:
            print("expanded", len(clusters.expand_hostlist(sys.argv[2], "SLURM_STEP_NODELIST")))
        else:
            job = clusters.resolve(environ=json.loads(sys.argv[1]))
            print("resolved", job.coordinator_address, job.num_processes)
    except Exception as e:
        print(type(e).__name__, str(e)[:300])
""")


def _bounded(env: dict, expand: str | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _BOUNDED_CHILD, json.dumps(env), *([expand] if expand else [])],
        capture_output=True, text=True,
        timeout=60)  # a generous bound against a hang (expanding took seconds), not a timing
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


@pytest.mark.parametrize("hostlist, count, first", [
    ("n[0-99999999]", 10**8, "n0"),
    ("a[0-999]b[0-999]c[0-999]", 10**9, "a0b0c0"),
    ("gpu[0001-9999]-x[1-9999999],cpu1", 9999 * 9999999 + 1, "gpu0001-x1"),
])
def test_a_huge_host_list_is_counted_not_expanded(hostlist, count, first):
    env = {**SLURM, "SLURM_STEP_NODELIST": hostlist, "SLURM_STEP_NUM_NODES": str(count)}
    assert _bounded(env) == f"resolved {first}:{61440 + 5123456 % 4096} 4"
    env["SLURM_STEP_NUM_NODES"] = "2"
    assert _bounded(env).startswith(
        f"InvalidArgumentError SLURM_STEP_NUM_NODES=2 but SLURM_STEP_NODELIST names {count} ")


def test_a_host_list_s_names_have_at_most_so_many_characters():
    longest = clusters.HOST_NAME_CHARACTERS
    name = "x" * (longest - 2)
    assert clusters.expand_hostlist(f"{name}[9-10]") == [name + "9", name + "10"]
    with pytest.raises(errors.InvalidArgumentError, match=f"more than {longest} characters"):
        clusters.expand_hostlist(f"{name}[9-100]")
    # 2**18 names of 10**5 characters would take 26 GB
    assert _bounded({}, expand="x" * 10**5 + "[1-262144]").startswith(
        "InvalidArgumentError SLURM_STEP_NODELIST is not a Slurm host list (a name of more "
        f"than {longest} characters)")


def test_a_host_list_of_more_hosts_than_a_count_holds_is_refused():
    hostlist = ",".join(["n" + "[0-999999999999999999]" * 10] * 100)  # 10**182 hosts
    said = _bounded({**SLURM, "SLURM_STEP_NODELIST": hostlist})
    assert said.startswith("InvalidArgumentError SLURM_STEP_NODELIST is not a Slurm host list")
    assert f"more than {clusters.MAX_INTEGER} hosts" in said


def test_expand_hostlist_refuses_past_its_bound_naming_the_variable():
    bound = clusters.MAX_EXPANDED_HOSTS
    said = _bounded({}, expand="n[0-99999999]")
    assert said.startswith("InvalidArgumentError SLURM_STEP_NODELIST names 100000000 hosts")
    assert f"at most {bound}" in said
    assert _bounded({}, expand=f"n[1-{bound}]") == f"expanded {bound}"


# -- IFRTPY_COORDINATOR_PORT beside an explicit address ---------------------------------------

@pytest.mark.parametrize("port", ["abc", "0", "65536", "-1", "12.5"])
def test_a_malformed_port_is_refused_beside_an_explicit_address(port):
    with pytest.raises(errors.InvalidArgumentError, match="IFRTPY_COORDINATOR_PORT"):
        clusters.resolve(environ={**EXPLICIT, "IFRTPY_COORDINATOR_PORT": port})
    with pytest.raises(errors.InvalidArgumentError, match="IFRTPY_COORDINATOR_PORT"):
        clusters.resolve("127.0.0.1:1234", 1, 0, environ={"IFRTPY_COORDINATOR_PORT": port})


def test_a_valid_port_beside_an_explicit_address_leaves_the_address_as_given():
    job = clusters.resolve(environ={**EXPLICIT, "IFRTPY_COORDINATOR_PORT": "1234"})
    assert job.coordinator_address == EXPLICIT["IFRTPY_COORDINATOR_ADDRESS"]
