"""The deploy/ folder: what can run here runs, the rest is checked against the installed tools.

Runs for real: ``deploy/local/start_cluster.sh`` (a ``dask scheduler`` and
``dask worker`` processes on 127.0.0.1) and ``deploy/slurm/allocation.sbatch``
(with a stand-in ``srun`` that starts the tasks on this machine); both must
leave no process behind.  Checked without Docker, Kubernetes or SLURM: every
YAML file parses; the ``dask scheduler`` / ``dask worker`` command lines of the
compose file, the operator manifests and the sbatch scripts use only options
the installed dask CLI has; the driver command lines parse with the driver's
own argument parser; file and name references between the files agree.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
IMAGE_ROOT = "/opt/mwumkl"  # WORKDIR of deploy/docker/Dockerfile, where deploy/ is copied
TAG_VAR = "MWUMKL_DEPLOY_TEST_TAG"


# ----------------------------------------------------------------------------- helpers


def dask_executable() -> str:
    """The ``dask`` command of this Python installation."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    exe = shutil.which("dask", path=path)
    if exe is None:
        pytest.fail("the 'dask' command is not installed next to this Python (pip install 'dask[distributed]')")
    return exe


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def dask_options() -> dict[str, set[str]]:
    """Long options of ``dask scheduler`` and ``dask worker``, read from their ``--help``."""
    options = {}
    for sub in ("scheduler", "worker"):
        result = subprocess.run([dask_executable(), sub, "--help"], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"`dask {sub} --help` failed:\n{result.stderr}"
        options[sub] = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", result.stdout))
        assert "--help" in options[sub]
    return options


@pytest.fixture(scope="module")
def driver():
    return load_module(DEPLOY / "driver.py", "mwumkl_deploy_driver_under_test")


def check_dask_command(argv, options) -> None:
    """``argv`` is ``dask scheduler|worker ...`` with options the installed CLI knows."""
    argv = [str(a) for a in argv]
    assert argv[:1] == ["dask"] and argv[1:2] in (["scheduler"], ["worker"]), f"not a dask command: {argv}"
    for token in argv[2:]:
        if token.startswith("--"):
            flag = token.split("=", 1)[0]
            assert flag in options[argv[1]], f"`dask {argv[1]}` has no option {flag} (in {argv})"


def check_driver_command(argv, parser, image_root=None) -> list[str]:
    """``argv`` is ``python <driver> ARGS``: the script exists and ``ARGS`` parse; returns ``ARGS``."""
    argv = [str(a) for a in argv]
    assert argv[0] == "python", argv
    script = argv[1]
    if image_root is not None and script.startswith(image_root + "/"):
        script = script[len(image_root) + 1 :]
    assert (REPO / script).is_file(), f"{argv[1]} is not a file of the repository"
    try:
        parser.parse_args(argv[2:])
    except SystemExit:
        pytest.fail(f"the driver rejects the arguments {argv[2:]}")
    return argv[2:]


def interpolate(value: str) -> str:
    """Compose-style ``${VAR:-default}`` with the defaults (the variables unset)."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: m.group(2), value)


def tagged_processes(tag: str) -> list[str]:
    """Live processes whose environment holds ``TAG_VAR=tag`` (pid and command line)."""
    found = []
    needle = f"{TAG_VAR}={tag}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{entry.name}: {cmd}")
        except OSError:  # gone, or a zombie
            continue
    return found


def run_tagged(cmd, *, env=None, cwd=None, timeout=150):
    """Run ``cmd`` with a unique environment tag; afterwards no tagged process may be left.

    On a timeout the command gets SIGTERM (its cleanup runs) before SIGKILL;
    leftovers are killed after the check, so one failure does not leak into others.
    """
    if not Path("/proc/self/environ").exists():
        pytest.skip("needs /proc to find leftover processes")
    tag = uuid.uuid4().hex
    full_env = {**os.environ, **(env or {}), TAG_VAR: tag}
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"{cmd} did not finish within {timeout} s:\n{out}\n{err}")
    finally:
        # The command waits for its processes before exiting; allow a little slack, then judge.
        deadline = time.monotonic() + 5
        while tagged_processes(tag) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = tagged_processes(tag)
        for line in left:
            try:
                os.kill(int(line.split(":", 1)[0]), signal.SIGKILL)
            except OSError:
                pass
    assert not left, "processes left running:\n" + "\n".join(left)
    return proc.returncode, out, err


# ----------------------------------------------------------------------------- all files


def deploy_yaml_files():
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yml", ".yaml"))


def test_every_yaml_file_parses():
    files = deploy_yaml_files()
    names = {p.relative_to(DEPLOY).as_posix() for p in files}
    assert {
        "docker/docker-compose.yml",
        "kubernetes/daskcluster.yaml",
        "kubernetes/daskjob.yaml",
        "slurm/jobqueue.yaml",
    } <= names
    for path in files:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert documents and all(isinstance(d, dict) for d in documents), path


def test_no_removed_hyphenated_dask_commands():
    # `dask-scheduler` / `dask-worker` were removed from distributed: only `dask scheduler` / `dask worker`.
    pattern = re.compile(r"dask-(scheduler|worker)(?![\w-])")
    for path in DEPLOY.rglob("*"):
        if path.is_file() and path.suffix != ".md":
            assert not pattern.search(path.read_text()), f"{path} uses a removed hyphenated dask command"


def test_installed_dask_cli_has_the_commands(dask_options):
    assert {"--scheduler-file", "--port", "--host", "--no-dashboard", "--dashboard-address"} <= dask_options[
        "scheduler"
    ]
    assert {"--nthreads", "--scheduler-file", "--no-dashboard", "--death-timeout", "--name"} <= dask_options["worker"]


def test_readmes_exist():
    for sub in ("", "local", "docker", "kubernetes", "slurm"):
        readme = DEPLOY / sub / "README.md"
        assert readme.is_file() and len(readme.read_text().split()) > 50, readme


# ----------------------------------------------------------------------------- driver


def test_driver_help_and_missing_scheduler(driver, capsys, monkeypatch):
    """In process (``main``): the unreachable-scheduler test below runs the script itself."""
    with pytest.raises(SystemExit) as exc:
        driver.main(["--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and "--scheduler" in out and "--shards" in out
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    assert driver.main([]) == 1
    assert "error: no scheduler given" in capsys.readouterr().err


def test_driver_unreachable_scheduler_is_a_clear_error():
    # No wall-clock bound (the child's start alone took 30 s on a loaded machine): a hang ends in the timeout.
    script = DEPLOY / "driver.py"
    result = subprocess.run(
        [sys.executable, str(script), "--scheduler", "tcp://127.0.0.1:1", "--timeout", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1
    assert "cannot reach the Dask scheduler at tcp://127.0.0.1:1" in result.stderr
    assert "Traceback" not in result.stderr


def test_driver_uses_the_estimators_defaults(driver):
    from mwumkl_dist import MWUMKLClassifier

    defaults = MWUMKLClassifier().get_params()
    args = driver.build_parser().parse_args([])
    assert (args.epsilon, args.C, args.kernels) == (defaults["epsilon"], defaults["C"], defaults["kernels"])
    args = driver.build_parser().parse_args(["--epsilon", "0.3", "--C", "inf"])
    assert args.epsilon == 0.3 and math.isinf(args.C)


def test_driver_rejects_bad_arguments(driver, capsys):
    parser = driver.build_parser()
    bad_lines = (["--shards", "0"], ["--test-size", "1"], ["--epsilon", "-1"], ["--C", "0"], ["--C", "x"], ["--bogus"])
    for bad in bad_lines:
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
    capsys.readouterr()
    for argv, message in (
        (["--resume", "auto"], "--resume auto needs --checkpoint"),
        (["--model", "/nonexistent-dir/model.npz"], "the directory does not exist"),
    ):
        with pytest.raises(SystemExit) as exc:
            driver.main(argv)
        assert exc.value.code == 2 and message in capsys.readouterr().err


# ----------------------------------------------------------------------------- local


@pytest.mark.slow
def test_local_cluster_script_fits_and_stops_everything(tmp_path):
    result_file = tmp_path / "result.json"
    model = tmp_path / "model.npz"
    code, out, err = run_tagged(
        [
            "bash",
            str(DEPLOY / "local" / "start_cluster.sh"),
            "-n",
            "2",
            "--",
            "--json",
            str(result_file),
            "--model",
            str(model),
            "--compare-local",
            "--C",
            "10",  # what C="auto" picks here: its cross-validation runs in the driver, not on the cluster
        ],
        env={"PYTHON": sys.executable, "DASK": dask_executable(), "TMPDIR": str(tmp_path)},
    )
    assert code == 0, f"stdout:\n{out}\nstderr:\n{err}"
    pids = [int(p) for p in re.findall(r"^started (?:scheduler|worker \d+) \(pid (\d+)\)", out, re.M)]
    assert len(pids) == 3, out
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert "cluster stopped" in out
    result = json.loads(result_file.read_text())
    assert result["scheduler"].startswith("tcp://127.0.0.1:")
    assert result["n_workers"] == 2 and result["n_shards"] == 2
    assert result["test_error"] < 0.1
    # The real cluster gives the local engine's model.
    assert result["local_max_difference"] <= 1e-12 and result["local_same_support"]
    from mwumkl_dist import MWUMKLClassifier

    assert MWUMKLClassifier.load(model).kernel_weights_ == pytest.approx(result["kernel_weights"], abs=0)
    assert not list(tmp_path.glob("mwumkl-local-cluster.*")), "the work directory was not removed"


@pytest.mark.slow
def test_local_cluster_script_cleans_up_after_a_failed_fit(tmp_path):
    code, out, err = run_tagged(
        ["bash", str(DEPLOY / "local" / "start_cluster.sh"), "-n", "1", "--", "--data", str(tmp_path / "none.svm")],
        env={"PYTHON": sys.executable, "DASK": dask_executable(), "TMPDIR": str(tmp_path)},
    )
    assert code == 1, f"stdout:\n{out}\nstderr:\n{err}"
    assert "none.svm" in err and "cluster stopped" in out


def test_local_cluster_script_usage_errors():
    script = str(DEPLOY / "local" / "start_cluster.sh")
    for args in (["-n", "0"], ["-n"], ["--bogus"]):
        result = subprocess.run(["bash", script, *args], capture_output=True, text=True, timeout=30)
        assert result.returncode == 2 and "error" in result.stderr, args
    result = subprocess.run(["bash", script, "--help"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and "Usage" in result.stdout


# ----------------------------------------------------------------------------- docker


def test_dockerfile():
    text = (DEPLOY / "docker" / "Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert lines[0] == "FROM python:3.11-slim"
    assert re.search(r"^RUN pip install /tmp/src", text, re.M)
    assert f"WORKDIR {IMAGE_ROOT}" in lines
    for line in lines:
        if line.startswith("COPY "):
            *sources, _dest = shlex.split(line)[1:]
            matched = [s for s in sources if "*" in s or (REPO / s).exists()]
            assert len(matched) == len(sources), f"{line}: a source is missing from the repository"
            assert any((REPO / s).exists() for s in sources if "*" not in s), line
    assert (DEPLOY / "docker" / "Dockerfile.dockerignore").is_file()
    # The build warms the numba cache with the demo command: it must exist.
    assert "python -m mwumkl_dist demo" in text
    result = subprocess.run(
        [sys.executable, "-m", "mwumkl_dist", "demo", "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_compose_file(dask_options, driver):
    path = DEPLOY / "docker" / "docker-compose.yml"
    compose = yaml.safe_load(path.read_text())
    services = compose["services"]
    assert set(services) == {"scheduler", "worker", "driver"}
    images = {s["image"] for s in services.values()}
    assert len(images) == 1, "all services must run the same image"
    for service in services.values():
        build = service["build"]
        context = (path.parent / build["context"]).resolve()
        assert (context / "pyproject.toml").is_file() and (context / build["dockerfile"]).is_file()

    scheduler = [interpolate(str(a)) for a in services["scheduler"]["command"]]
    check_dask_command(scheduler, dask_options)
    port = scheduler[scheduler.index("--port") + 1]
    http_port = scheduler[scheduler.index("--dashboard-address") + 1].rsplit(":", 1)[1]
    health = services["scheduler"]["healthcheck"]["test"]
    assert health[:3] == ["CMD", "python", "-c"] and f"localhost:{http_port}/health" in health[3]
    compile(health[3], "healthcheck", "exec")

    worker = [interpolate(str(a)) for a in services["worker"]["command"]]
    check_dask_command(worker, dask_options)
    assert f"tcp://scheduler:{port}" in worker and "--nthreads" in worker
    assert int(interpolate(str(services["worker"]["deploy"]["replicas"]))) >= 1
    assert services["worker"]["depends_on"]["scheduler"]["condition"] == "service_healthy"

    command = [interpolate(str(a)) for a in services["driver"]["command"]]
    args = check_driver_command(command, driver.build_parser())
    assert args[args.index("--scheduler") + 1] == f"tcp://scheduler:{port}"
    assert args[args.index("--workers") + 1] == interpolate(str(services["worker"]["deploy"]["replicas"]))
    volume, mount = services["driver"]["volumes"][0].split(":")
    assert volume in compose["volumes"] and args[args.index("--model") + 1].startswith(mount + "/")


# ----------------------------------------------------------------------------- kubernetes


def containers(pod_spec):
    return {c["name"]: c for c in pod_spec["containers"]}


def check_dask_cluster_spec(spec, cluster_name, dask_options):
    """Worker and scheduler pods of a DaskCluster spec (also inside a DaskJob)."""
    worker = containers(spec["worker"]["spec"])["worker"]
    assert spec["worker"]["replicas"] >= 1
    check_dask_command(worker["args"], dask_options)
    assert "$(DASK_WORKER_NAME)" in worker["args"]  # set by the operator
    scheduler = containers(spec["scheduler"]["spec"])["scheduler"]
    check_dask_command(scheduler["args"], dask_options)
    named_ports = {p["name"]: p["containerPort"] for p in scheduler["ports"]}
    assert named_ports["tcp-comm"] == 8786  # the operator points DASK_SCHEDULER_ADDRESS at :8786
    for probe in ("readinessProbe", "livenessProbe"):
        assert scheduler[probe]["httpGet"]["port"] in named_ports
    service = spec["scheduler"]["service"]
    assert service["selector"] == {"dask.org/cluster-name": cluster_name, "dask.org/component": "scheduler"}
    for port in service["ports"]:
        assert port["targetPort"] in named_ports
    assert {p["port"] for p in service["ports"]} >= {8786}
    return {worker["image"], scheduler["image"]}


def test_daskcluster_manifest(dask_options):
    manifest = yaml.safe_load((DEPLOY / "kubernetes" / "daskcluster.yaml").read_text())
    assert manifest["apiVersion"] == "kubernetes.dask.org/v1" and manifest["kind"] == "DaskCluster"
    images = check_dask_cluster_spec(manifest["spec"], manifest["metadata"]["name"], dask_options)
    assert len(images) == 1


def test_daskjob_manifest(dask_options, driver):
    kdir = DEPLOY / "kubernetes"
    job = yaml.safe_load((kdir / "daskjob.yaml").read_text())
    assert job["apiVersion"] == "kubernetes.dask.org/v1" and job["kind"] == "DaskJob"
    name = job["metadata"]["name"]
    # The operator names the job's cluster after the job.
    images = check_dask_cluster_spec(job["spec"]["cluster"]["spec"], name, dask_options)
    pod = job["spec"]["job"]["spec"]
    runner = containers(pod)["job"]
    images.add(runner["image"])
    assert len(images) == 1, "the driver, scheduler and workers must run the same image"
    args = check_driver_command(runner["args"], driver.build_parser(), image_root=IMAGE_ROOT)
    assert "--scheduler" not in args  # the operator sets DASK_SCHEDULER_ADDRESS
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in runner["volumeMounts"]}
    assert set(mounts) <= set(volumes)
    assert args[args.index("--model") + 1].startswith(mounts["results"] + "/")
    pvc = yaml.safe_load((kdir / "pvc.yaml").read_text())
    assert pvc["kind"] == "PersistentVolumeClaim" and pvc["apiVersion"] == "v1"
    assert volumes["results"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    policy = yaml.safe_load((kdir / "networkpolicy.yaml").read_text())
    assert policy["kind"] == "NetworkPolicy" and policy["apiVersion"] == "networking.k8s.io/v1"
    assert policy["spec"]["podSelector"]["matchLabels"]["dask.org/cluster-name"] == name
    assert policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"] == {"dask.org/cluster-name": name}


# ----------------------------------------------------------------------------- slurm

#: The keys dask-jobqueue 0.9 reads from jobqueue.slurm (its bundled jobqueue.yaml).
JOBQUEUE_SLURM_KEYS = {
    "name", "cores", "memory", "processes", "python", "interface", "death-timeout", "local-directory",
    "shared-temp-directory", "extra", "worker-command", "worker-extra-args", "shebang", "queue", "account",
    "walltime", "env-extra", "job-script-prologue", "job-cpu", "job-mem", "job-extra", "job-extra-directives",
    "job-directives-skip", "log-directory", "scheduler-options",
}  # fmt: skip


def test_jobqueue_config(dask_options):
    config = yaml.safe_load((DEPLOY / "slurm" / "jobqueue.yaml").read_text())
    slurm = config["jobqueue"]["slurm"]
    assert set(slurm) <= JOBQUEUE_SLURM_KEYS, set(slurm) - JOBQUEUE_SLURM_KEYS
    assert slurm["cores"] >= 1 and slurm["processes"] >= 1
    check_dask_command(["dask", "worker", *slurm["worker-extra-args"]], dask_options)


def run_slurm_driver(args, block_jobqueue=False, timeout=120, env=None):
    script = str(DEPLOY / "slurm" / "driver.py")
    prelude = "import sys\n"
    if block_jobqueue:
        prelude += "sys.modules['dask_jobqueue'] = None  # as if not installed\n"
    code = prelude + f"import runpy; sys.argv = {[script, *args]!r}; runpy.run_path({script!r}, run_name='__main__')"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO
    )


def test_slurm_driver_help_and_clear_error_without_jobqueue(tmp_path, capsys, monkeypatch):
    result = run_slurm_driver(["--jobs", "2"], block_jobqueue=True)  # the script itself, in a subprocess
    assert result.returncode == 1
    assert "dask-jobqueue is not installed" in result.stderr and "Traceback" not in result.stderr
    # The rest in process (its main), as if dask-jobqueue were not installed.
    monkeypatch.setitem(sys.modules, "dask_jobqueue", None)
    slurm_driver = load_module(DEPLOY / "slurm" / "driver.py", "mwumkl_slurm_driver_under_test")
    with pytest.raises(SystemExit) as exc:
        slurm_driver.main(["--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and "--jobs" in out and "--shards" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text("jobqueue:\n  pbs: {}\n")
    assert slurm_driver.main(["--config", str(bad)]) == 1
    assert "no 'jobqueue: slurm:' section" in capsys.readouterr().err


def _needs_dask_jobqueue():
    """Skip without dask-jobqueue, never importing it here: its runner module replaces this process's SIGINT
    handler at import (``signal.signal(SIGINT, lambda *_: sys.exit())``), which later tests would inherit."""
    import importlib.util

    if importlib.util.find_spec("dask_jobqueue") is None:
        pytest.skip("dask-jobqueue is not installed")


def test_slurm_driver_job_script():
    _needs_dask_jobqueue()
    result = run_slurm_driver(["--dry-run", "--queue", "cpu", "--account", "proj"])
    assert result.returncode == 0, result.stderr
    assert "#SBATCH -p cpu" in result.stdout and "#SBATCH -A proj" in result.stdout
    assert "--nthreads 1" in result.stdout and "-t 02:00:00" in result.stdout


FAKE_SBATCH = """#!/usr/bin/env bash
# Stand-in for sbatch: run the job script (a copy: the caller deletes it) in the background.
script="${@: -1}"
copy=$(mktemp "$FAKE_SLURM_DIR/job-XXXXXX")
cp "$script" "$copy"
setsid bash "$copy" >"$copy.log" 2>&1 </dev/null &
echo "Submitted batch job $!"
"""

FAKE_SCANCEL = """#!/usr/bin/env bash
# Stand-in for scancel: the job id is the process group of the job script.
for job in "$@"; do kill -TERM -- "-$job" 2>/dev/null || true; done
"""


@pytest.mark.slow
def test_slurm_driver_with_stand_in_sbatch(tmp_path):
    _needs_dask_jobqueue()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH), ("scancel", FAKE_SCANCEL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    result_file = tmp_path / "result.json"
    code, out, err = run_tagged(
        [
            sys.executable,
            str(DEPLOY / "slurm" / "driver.py"),
            "--jobs",
            "1",
            "--timeout",
            "120",
            "--json",
            str(result_file),
            "--compare-local",
        ],
        cwd=tmp_path,
        env={
            "PATH": os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]]),
            "FAKE_SLURM_DIR": str(tmp_path),
            "TMPDIR": str(tmp_path),
        },
    )
    assert code == 0, f"stdout:\n{out}\nstderr:\n{err}"
    assert "submitted 1 SLURM jobs for 1 Dask workers" in out
    result = json.loads(result_file.read_text())
    assert result["n_workers"] == 1 and result["local_max_difference"] <= 1e-12


FAKE_SRUN = """#!/usr/bin/env bash
# Stand-in for srun: start the command once per task on this machine.
n=1
while [[ $# -gt 0 && $1 == -* ]]; do
    case $1 in --ntasks=*) n=${1#--ntasks=} ;; -n | --ntasks) n=$2; shift ;; esac
    shift
done
pids=()
for ((i = 0; i < n; i++)); do "$@" & pids+=($!); done
trap 'kill -TERM "${pids[@]}" 2>/dev/null; wait' TERM INT
wait
"""


def test_sbatch_scripts_are_valid_bash():
    for name in ("submit.sbatch", "allocation.sbatch"):
        path = DEPLOY / "slurm" / name
        text = path.read_text()
        assert text.startswith("#!/bin/bash") and "#SBATCH --time=" in text
        result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_allocation_sbatch_runs_with_a_stand_in_srun(tmp_path, dask_options):
    text = (DEPLOY / "slurm" / "allocation.sbatch").read_text()
    # Its dask commands use options the installed CLI has.
    joined = text.replace("\\\n", " ")
    for line in joined.splitlines():
        tokens = shlex.split(line, comments=True)
        if "dask" in tokens:
            check_dask_command(tokens[tokens.index("dask") :], dask_options)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    dask_dir = str(Path(dask_executable()).parent)
    code, out, err = run_tagged(
        ["bash", str(DEPLOY / "slurm" / "allocation.sbatch")],
        cwd=tmp_path,
        env={
            "PATH": os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), dask_dir, os.environ["PATH"]]),
            "SLURM_NTASKS": "1",  # one worker: the local-cluster test already runs two
            "SLURM_JOB_ID": "42",
            "SLURM_SUBMIT_DIR": str(REPO),
            "OUTPUT_DIR": str(out_dir),
            "TMPDIR": str(tmp_path),
        },
    )
    assert code == 0, f"stdout:\n{out}\nstderr:\n{err}"
    assert re.search(r"^workers\s+1:", out, re.M) and "test error" in out
    from mwumkl_dist import MWUMKLClassifier

    model = MWUMKLClassifier.load(out_dir / "mwumkl-model-42.npz")
    assert model.kernel_weights_.shape == (len(model.kernel_names_),) and len(model.kernel_names_) >= 12
    # Named after the data and the settings ({fit}): another fit in this folder gets its own checkpoint.
    assert len(list(out_dir.glob("mwumkl-checkpoint-breast-cancer-*.npz"))) == 1
    assert not (out_dir / "mwumkl-scheduler-42.json").exists(), "the scheduler file was not removed"
