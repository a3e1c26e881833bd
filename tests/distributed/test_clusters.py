"""initialize() without arguments: the job found in the variables its launcher set
(ifrtpy.distributed.clusters). What each launcher's variables give, compared with jax's
own cluster detection where jax reads the same; malformed and inconsistent variables;
the Kubernetes API read; and simulated SLURM, Open MPI and Kubernetes jobs of 2 processes
on loopback, each joining with initialize() alone (bounded, no process left behind)."""

import http.server
import json
import shutil
import socket
import ssl
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from ifrtpy import distributed, errors
from ifrtpy.distributed import clusters
from ifrtpy.distributed.clusters import resolve
from job_helpers import assert_no_stray_processes, free_port, job_environment, use_environment

SLURM = {"SLURM_JOB_ID": "5123456", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "gpu[007-008]",
         "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4",
         "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1"}
ORTE = {"OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://10.96.0.1,10.148.0.1:34911",
        "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_RANK": "5",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
PRRTE = {"PRTE_LAUNCHED": "1", "PMIX_NAMESPACE": "prterun-node-18-12345@1",
         "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1",
         "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
K8S = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
       "JOB_COMPLETION_INDEX": "2", "HOSTNAME": "train-2", "IFRTPY_NUM_PROCESSES": "4"}


@pytest.fixture
def pod(monkeypatch):
    """This process as a Kubernetes pod: ``pod(fqdn)`` makes socket.getfqdn answer as the
    pod's /etc/hosts would."""
    def set_fqdn(fqdn):
        monkeypatch.setattr(socket, "getfqdn", lambda name="": fqdn)
    return set_fqdn


# -- what each launcher gives ---------------------------------------------------------------

def test_explicit_variables_each_alone_and_arguments_first():
    job = resolve(environ={"IFRTPY_COORDINATOR_ADDRESS": "10.0.0.1:1234",
                           "IFRTPY_NUM_PROCESSES": "3", "IFRTPY_PROCESS_ID": "2",
                           "IFRTPY_LOCAL_PROCESS_ID": "0", "IFRTPY_LOCAL_DEVICE_COUNT": "4"})
    assert (job.coordinator_address, job.num_processes, job.process_id, job.local_process_id,
            job.local_device_count) == ("10.0.0.1:1234", 3, 2, 0, 4)
    assert job.origins["num_processes"] == "IFRTPY_NUM_PROCESSES"
    # an argument wins over its variable; a variable alone fills in what a launcher says
    job = resolve(process_id=1, environ={**SLURM, "IFRTPY_COORDINATOR_ADDRESS": "[::1]:99"})
    assert (job.coordinator_address, job.num_processes, job.process_id) == ("[::1]:99", 4, 1)
    assert job.origins == {"coordinator_address": "IFRTPY_COORDINATOR_ADDRESS",
                           "num_processes": "SLURM_STEP_NUM_TASKS",
                           "process_id": "the process_id argument"}


def test_slurm_step():
    job = resolve(environ=SLURM)
    assert job.coordinator_address == f"gpu007:{61440 + 5123456 % 4096}"
    assert (job.num_processes, job.process_id, job.local_process_id) == (4, 3, 1)
    assert "SLURM_STEP_NODELIST" in job.origins["coordinator_address"]
    # jax's variable for the count, when the step's is missing; the port can be chosen
    env = {k: v for k, v in SLURM.items() if k != "SLURM_STEP_NUM_TASKS"}
    job = resolve(environ={**env, "IFRTPY_COORDINATOR_PORT": "2222"})
    assert (job.coordinator_address, job.num_processes) == ("gpu007:2222", 4)
    assert job.origins["num_processes"] == "SLURM_NTASKS"
    # a batch script (no step) is not a job
    batch = {k: v for k, v in SLURM.items() if not k.startswith("SLURM_STEP")}
    with pytest.raises(errors.InvalidArgumentError, match="no launcher found"):
        resolve(environ=batch)


def test_open_mpi_before_slurm():
    """mpirun inside a Slurm allocation: the ranks carry the SLURM variables of the daemon
    srun started (one task, id 0), and Open MPI's, which are the ranks'."""
    daemon = {**SLURM, "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}
    job = resolve(environ={**daemon, **ORTE})
    assert job.coordinator_address == f"10.96.0.1:{61440 + 1531576320 // 4096 % 4096}"
    assert (job.num_processes, job.process_id, job.local_process_id) == (8, 5, 1)
    assert job.origins["process_id"] == "OMPI_COMM_WORLD_RANK"


def test_open_mpi_ipv6_and_prrte():
    job = resolve(environ={**ORTE, "OMPI_MCA_orte_hnp_uri":
                           "1314521088.0;tcp6://[fe80::b9b:ac5d:9cf0:b858,2620:10d::2]:43370"})
    port = 61440 + 1314521088 // 4096 % 4096
    assert job.coordinator_address == f"[fe80::b9b:ac5d:9cf0:b858]:{port}"
    job = resolve(environ=PRRTE)  # Open MPI 5: prterun's host and pid
    assert (job.coordinator_address, job.num_processes, job.process_id) == (
        f"node-18:{61440 + 12345 % 4096}", 2, 1)


def test_kubernetes_indexed_job_and_jobset(pod):
    pod("train-2.workers.ml.svc.cluster.local")
    job = resolve(environ=K8S)
    assert (job.coordinator_address, job.num_processes, job.process_id) == (
        "train-0.workers:55527", 4, 2)
    # a JobSet's pod: <jobset>-<replicated job>-<job index>-<pod index>, subdomain the JobSet's
    pod("js-workers-1-2.js.ml.svc.cluster.local")
    job = resolve(environ={**K8S, "HOSTNAME": "js-workers-1-2"})
    assert job.coordinator_address == "js-workers-1-0.js:55527"
    # without a subdomain, an explicit address does (and only it)
    pod("train-2")
    with pytest.raises(errors.InvalidArgumentError, match="spec.subdomain"):
        resolve(environ=K8S)
    job = resolve(environ={**K8S, "IFRTPY_COORDINATOR_ADDRESS": "10.1.2.3:5000"})
    assert (job.coordinator_address, job.process_id) == ("10.1.2.3:5000", 2)


def test_nothing_found_says_what_was_looked_for():
    with pytest.raises(errors.InvalidArgumentError) as e:
        resolve(environ={"IFRTPY_PROCESS_ID": "0", "KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    message = str(e.value)
    assert "needs coordinator_address (or IFRTPY_COORDINATOR_ADDRESS) and num_processes" in message
    for what in ("OMPI_MCA_orte_hnp_uri", "SLURM_STEP_NODELIST", "JOB_COMPLETION_INDEX",
                 "python -m ifrtpy launch"):
        assert what in message


def test_slurm_host_lists():
    expand = clusters.expand_hostlist
    assert expand("node001") == ["node001"]
    assert expand("node[001-003,007],gpu[1-2]") == [
        "node001", "node002", "node003", "node007", "gpu1", "gpu2"]
    assert expand("rack[1-2]-n[08-09]") == ["rack1-n08", "rack1-n09", "rack2-n08", "rack2-n09"]
    assert expand("n[9-11]") == ["n9", "n10", "n11"]
    for bad in ("", "n[1-2", "n1-2]", "n[[1]]", "a,,b", "n[3-1]", "n[a-b]", "n[]", "a b"):
        with pytest.raises(errors.InvalidArgumentError, match="SLURM_STEP_NODELIST"):
            expand(bad, "SLURM_STEP_NODELIST")


# -- bad input: each error names the variable ----------------------------------------------

@pytest.mark.parametrize("env, names", [
    ({"IFRTPY_COORDINATOR_ADDRESS": "node1", "IFRTPY_NUM_PROCESSES": "2",
      "IFRTPY_PROCESS_ID": "0"}, ["IFRTPY_COORDINATOR_ADDRESS", "host:port"]),
    ({"IFRTPY_COORDINATOR_ADDRESS": "fe80::1:80", "IFRTPY_NUM_PROCESSES": "2",
      "IFRTPY_PROCESS_ID": "0"}, ["IFRTPY_COORDINATOR_ADDRESS", "brackets"]),
    ({"IFRTPY_COORDINATOR_ADDRESS": "h:70000", "IFRTPY_NUM_PROCESSES": "2",
      "IFRTPY_PROCESS_ID": "0"}, ["IFRTPY_COORDINATOR_ADDRESS", "1..65535"]),
    ({**SLURM, "SLURM_STEP_NODELIST": "gpu[007-"}, ["SLURM_STEP_NODELIST", "unbalanced"]),
    ({**SLURM, "SLURM_STEP_NUM_NODES": "3"}, ["SLURM_STEP_NUM_NODES=3", "names 2 node"]),
    ({**SLURM, "SLURM_PROCID": "4"}, ["SLURM_PROCID=4", "SLURM_STEP_NUM_TASKS=4"]),
    ({**SLURM, "SLURM_PROCID": "x"}, ["SLURM_PROCID", "'x'"]),
    ({**SLURM, "IFRTPY_NUM_PROCESSES": "2"}, ["IFRTPY_NUM_PROCESSES", "SLURM_PROCID"]),
    ({**SLURM, "IFRTPY_COORDINATOR_PORT": "0"}, ["IFRTPY_COORDINATOR_PORT"]),
    ({**ORTE, "OMPI_MCA_orte_hnp_uri": "1531576320.0;ucx://x"}, ["OMPI_MCA_orte_hnp_uri"]),
    ({**ORTE, "OMPI_COMM_WORLD_RANK": "8"}, ["OMPI_COMM_WORLD_RANK=8", "OMPI_COMM_WORLD_SIZE=8"]),
    ({k: v for k, v in ORTE.items() if k != "OMPI_COMM_WORLD_SIZE"}, ["OMPI_COMM_WORLD_SIZE"]),
    ({**PRRTE, "PMIX_NAMESPACE": "nonsense"}, ["PMIX_NAMESPACE"]),
    ({**K8S, "HOSTNAME": "train-0"}, ["HOSTNAME='train-0'", "JOB_COMPLETION_INDEX=2"]),
    ({**K8S, "IFRTPY_NUM_PROCESSES": "2"}, ["IFRTPY_NUM_PROCESSES", "JOB_COMPLETION_INDEX"]),
])
def test_malformed_or_inconsistent_variables_are_named(env, names, pod):
    pod("train-2.workers.ml.svc.cluster.local")
    with pytest.raises(errors.InvalidArgumentError) as e:
        resolve(environ=env)
    for name in names:
        assert name in str(e.value)


def test_initialize_raises_them_before_anything_starts(monkeypatch):
    use_environment(monkeypatch, job_environment({**SLURM, "SLURM_PROCID": "7"})[0])
    with pytest.raises(errors.InvalidArgumentError, match="SLURM_PROCID=7 is not below"):
        distributed.initialize()
    assert not distributed.is_initialized()


def test_a_port_in_use_names_where_the_address_came_from(monkeypatch):
    """The port SLURM_JOB_ID gives is taken: process 0's coordinator cannot listen there,
    and the error says where the address came from and how to choose another port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port(clusters.DERIVED_PORTS)))
        taken.listen()
        port = taken.getsockname()[1]
        env, marker = job_environment({
            "SLURM_JOB_ID": str(4096 * 1000 + port - 61440), "SLURM_STEP_NODELIST": "localhost",
            "SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"})
        use_environment(monkeypatch, env)
        with pytest.raises(errors.UnavailableError) as e:
            distributed.initialize(initialization_timeout=10)
    message = str(e.value)
    assert f"127.0.0.1:{port}" in message and "in use" in message
    assert "SLURM_JOB_ID" in message and "IFRTPY_COORDINATOR_PORT" in message
    assert not distributed.is_initialized()
    assert_no_stray_processes(marker)


# -- the same as jax ------------------------------------------------------------------------

@pytest.mark.parametrize("env", [
    {**SLURM, "SLURM_STEP_NODELIST": "node001", "SLURM_STEP_NUM_NODES": "1"},
    {**SLURM, "SLURM_STEP_NODELIST": "node001,host2"},
    {**SLURM, "SLURM_STEP_NODELIST": "node[001-0015],host2", "SLURM_STEP_NUM_NODES": "16"},
    {**SLURM, "SLURM_STEP_NODELIST": "node[001,007-015],host2", "SLURM_STEP_NUM_NODES": "11",
     "SLURM_JOB_ID": "4095"},
    ORTE,
    {**ORTE, "OMPI_MCA_orte_hnp_uri": "4096.0;tcp://192.168.1.7:1000"},
])
def test_where_jax_detects_the_same_launcher_it_finds_the_same_job(env, monkeypatch):
    """jax's own cluster classes, on the same variables, find the same coordinator, count,
    id and local id (the oracle: jax.distributed.initialize() without arguments)."""
    jax_clusters = pytest.importorskip("jax._src.clusters")
    for name in clusters.VARIABLES + ("JAX_COORDINATOR_PORT",):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    found = [c for c in (jax_clusters.OmpiCluster, jax_clusters.SlurmCluster)
             if c.is_env_present()]
    jax_env = found[0]
    job = resolve(environ=env)
    assert job.coordinator_address == jax_env.get_coordinator_address(
        timeout_secs=None, override_coordinator_port=None)
    assert (job.num_processes, job.process_id, job.local_process_id) == (
        jax_env.get_process_count(), jax_env.get_process_id(), jax_env.get_local_process_id())


# -- Kubernetes: the Job's size from the API server -----------------------------------------

@pytest.fixture
def api_server(tmp_path, monkeypatch):
    """An HTTPS server on loopback answering as the API server for the Job 'train' in the
    namespace 'ml' (``answer[0]``: (status, body)), and this process's service account (its
    token, namespace and the server's certificate as the CA)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command (to make the server's certificate)")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "ca.crt")],
                   check=True, capture_output=True, timeout=60)
    (tmp_path / "token").write_text("secret-token\n")
    (tmp_path / "namespace").write_text("ml\n")
    monkeypatch.setattr(clusters, "SERVICE_ACCOUNT_DIR", str(tmp_path))
    answer = [(200, {})]
    requests = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            requests.append((self.path, self.headers.get("Authorization")))
            status, body = answer[0]
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(tmp_path / "ca.crt"), str(tmp_path / "key.pem"))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    env = {**K8S, "KUBERNETES_SERVICE_HOST": "127.0.0.1",
           "KUBERNETES_SERVICE_PORT": str(server.server_address[1])}
    del env["IFRTPY_NUM_PROCESSES"]
    yield env, answer, requests
    server.shutdown()
    server.server_close()


def test_the_job_size_comes_from_the_api_server(api_server, pod):
    env, answer, requests = api_server
    pod("train-2.workers.ml.svc.cluster.local")
    answer[0] = (200, {"spec": {"parallelism": 3, "completions": 3}})
    job = resolve(environ=env)
    assert (job.num_processes, job.process_id) == (3, 2)
    assert job.origins["num_processes"] == "the spec.parallelism of Job 'train'"
    assert requests == [("/apis/batch/v1/namespaces/ml/jobs/train", "Bearer secret-token")]
    answer[0] = (200, {"spec": {"parallelism": 2, "completions": 4}})
    with pytest.raises(errors.InvalidArgumentError, match="parallelism 2 but completions 4"):
        resolve(environ=env)
    answer[0] = (403, {"reason": "Forbidden"})
    with pytest.raises(errors.PermissionDeniedError, match="'get' on 'jobs'.*IFRTPY_NUM_PROCESSES"):
        resolve(environ=env)


def test_without_a_service_account_the_error_says_to_set_the_count(pod, monkeypatch, tmp_path):
    pod("train-2.workers.ml.svc.cluster.local")
    monkeypatch.setattr(clusters, "SERVICE_ACCOUNT_DIR", str(tmp_path / "none"))
    env = {k: v for k, v in K8S.items() if k != "IFRTPY_NUM_PROCESSES"}
    with pytest.raises(errors.InvalidArgumentError, match="set IFRTPY_NUM_PROCESSES"):
        resolve(environ=env)


# -- simulated jobs on loopback, each process joining with initialize() alone ---------------

#: One process of a simulated job: argv[1] is the cluster's DNS (name -> address, as the
#: cluster's DNS and the pod's /etc/hosts would answer) and this host's FQDN.
WORKER = textwrap.dedent("""
    import json, socket, sys
    names, fqdn = json.loads(sys.argv[1]), sys.argv[2]
    system_getaddrinfo = socket.getaddrinfo
    socket.getaddrinfo = lambda host, *a, **k: system_getaddrinfo(names.get(host, host), *a, **k)
    socket.getfqdn = lambda name="": fqdn
    from ifrtpy import distributed
    from ifrtpy.distributed import clusters
    job = clusters.resolve()
    distributed.initialize(initialization_timeout=20, heartbeat_timeout=3)
    pid, count = distributed.process_id(), distributed.num_processes()
    store = distributed.key_value_store()
    store.put(f"from{pid}", f"hello from {pid}".encode())
    others = [store.get(f"from{q}", 20000).decode() for q in range(count)]
    print("RESULT " + json.dumps({"pid": pid, "count": count, "others": others,
                                  "address": job.coordinator_address, "origins": job.origins}))
    distributed.shutdown()
""")


def _run_job(variables_of, names=None, fqdn_of=lambda i: "", count=2, deadline_s=90):
    """Start ``count`` workers, process i with the launcher's ``variables_of(i)``; their
    results, once all have ended (killed after ``deadline_s``); no process may be left."""
    procs, marker = [], job_environment()[1]
    try:
        for i in range(count):
            procs.append(subprocess.Popen(
                [sys.executable, "-c", WORKER, json.dumps(names or {}), fqdn_of(i)],
                env=job_environment(variables_of(i), marker)[0],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        end = time.monotonic() + deadline_s
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=max(1, end - time.monotonic()))
            line = next((l for l in out.splitlines() if l.startswith("RESULT ")), None)
            assert proc.returncode == 0 and line, err[-3000:]
            results.append(json.loads(line[7:]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert_no_stray_processes(marker)
    for i, result in enumerate(results):
        assert (result["pid"], result["count"]) == (i, count)
        assert result["others"] == [f"hello from {q}" for q in range(count)]
    return results


def test_a_simulated_slurm_step():
    """srun -N2 -n2 on nodes node[001-002] (both on loopback here): the coordinator on the
    first node, at the port of the job id."""
    port = free_port(clusters.DERIVED_PORTS)
    job_id = 4096 * 1234 + port - 61440
    results = _run_job(lambda i: {
        "SLURM_JOB_ID": str(job_id), "SLURM_JOBID": str(job_id), "SLURM_STEP_ID": "0",
        "SLURM_JOB_NODELIST": "node[001-002]", "SLURM_STEP_NODELIST": "node[001-002]",
        "SLURM_NNODES": "2", "SLURM_STEP_NUM_NODES": "2", "SLURM_NTASKS": "2",
        "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_PROCID": str(i), "SLURM_LOCALID": "0", "SLURM_NODEID": str(i),
        "SLURMD_NODENAME": f"node00{i + 1}"},
        names={"node001": "127.0.0.1", "node002": "127.0.0.1"})
    assert {r["address"] for r in results} == {f"node001:{port}"}
    assert results[1]["origins"]["process_id"] == "SLURM_PROCID"


def test_a_simulated_open_mpi_job_inside_a_slurm_allocation():
    """mpirun -np 2 in a Slurm allocation: the ranks also carry the SLURM variables of the
    daemon srun started (task 0 of 1); Open MPI's decide."""
    port = free_port(clusters.DERIVED_PORTS)
    hnp_job = (4096 * 3 + port - 61440) * 4096
    results = _run_job(lambda i: {
        "OMPI_MCA_orte_hnp_uri": f"{hnp_job}.0;tcp://127.0.0.1,172.17.0.1:40123",
        "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": str(i),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(i), "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "OMPI_UNIVERSE_SIZE": "2", "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0",
        "SLURM_STEP_NODELIST": "node001", "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1",
        "SLURM_PROCID": "0", "SLURM_LOCALID": "0"})
    assert {r["address"] for r in results} == {f"127.0.0.1:{port}"}
    assert results[1]["origins"]["process_id"] == "OMPI_COMM_WORLD_RANK"


def test_a_simulated_kubernetes_indexed_job():
    """An Indexed Job 'train' of 2 pods with the headless service 'workers' as subdomain
    (both pods on loopback here). The port is set in the pod template
    (IFRTPY_COORDINATOR_PORT) rather than jax's 55527, which may be taken on this machine."""
    port = free_port()
    results = _run_job(
        lambda i: {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
                   "JOB_COMPLETION_INDEX": str(i), "HOSTNAME": f"train-{i}",
                   "IFRTPY_NUM_PROCESSES": "2", "IFRTPY_COORDINATOR_PORT": str(port)},
        names={"train-0.workers": "127.0.0.1", "train-1.workers": "127.0.0.1"},
        fqdn_of=lambda i: f"train-{i}.workers.default.svc.cluster.local")
    assert {r["address"] for r in results} == {f"train-0.workers:{port}"}
    assert results[0]["origins"]["process_id"] == "JOB_COMPLETION_INDEX"
