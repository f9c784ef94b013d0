"""Platform detection: one fixture per place we run.

Environment variables are what those platforms set; GPUs and TPUs cannot
exist on this machine, so the probes that stand in for them say so in their
names (``fake_two_t4_gpus``, ``fake_tpu_v3_8_chips``).
"""
from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from notebook_launch import notebook_launcher
from notebook_launch.detect import xla as tpu_detection
from notebook_launch.detect.platform import PLATFORMS, Environment, Probe, detect
from notebook_launch.scaffold.run import launch_summary
from notebook_launch.wire.plan import build_plan

KERNEL = "ipykernel.zmqshell.ZMQInteractiveShell"
COLAB_SHELL = "google.colab._shell.Shell"
TERMINAL = "IPython.terminal.interactiveshell.TerminalInteractiveShell"

COLAB_ENV = {"COLAB_RELEASE_TAG": "release-colab_20251101-060125_RC00", "COLAB_BACKEND_VERSION": "next"}
KAGGLE_ENV = {"KAGGLE_KERNEL_RUN_TYPE": "Interactive", "KAGGLE_URL_BASE": "https://www.kaggle.com",
              "KAGGLE_DATA_PROXY_URL": "https://dp.kaggle.net"}

# Probes: the process as each platform shows it. fake_* devices do not exist here: a fake TPU is
# a fake filesystem root (its /dev/accelN files) that the TPU probe (detect_xla) reads.
_FAKE_ROOTS = tempfile.TemporaryDirectory(prefix="fake_tpu_roots_")


def fake_tpu_root_with_accel_files(name: str, chips: int) -> str:
    root = Path(_FAKE_ROOTS.name) / name
    (root / "dev").mkdir(parents=True)
    for i in range(chips):
        (root / "dev" / f"accel{i}").write_text("")
    return str(root)


no_devices_in_kernel = Probe(shell_class=KERNEL, in_kernel=True)
colab_kernel_cpu = Probe(shell_class=COLAB_SHELL, in_kernel=True, modules=frozenset({"google.colab"}))
fake_colab_t4_gpu = Probe(shell_class=COLAB_SHELL, in_kernel=True, cuda_count=1, gpu_names=("Tesla T4",),
                          modules=frozenset({"google.colab"}))
fake_colab_tpu_v5e_chip = Probe(shell_class=COLAB_SHELL, in_kernel=True,
                                tpu_root=fake_tpu_root_with_accel_files("colab_v5e_1", 1),
                                modules=frozenset({"google.colab"}))
fake_two_t4_gpus = Probe(shell_class=KERNEL, in_kernel=True, cuda_count=2, gpu_names=("Tesla T4", "Tesla T4"))
fake_tpu_v3_8_chips = Probe(shell_class=KERNEL, in_kernel=True,
                            tpu_root=fake_tpu_root_with_accel_files("kaggle_v3_8", 4))

CASES = {
    "colab-gpu": (dict(COLAB_ENV, COLAB_GPU="1"), fake_colab_t4_gpu),
    "colab-tpu": (dict(COLAB_ENV, TPU_ACCELERATOR_TYPE="v5litepod-1", PJRT_DEVICE="TPU"), fake_colab_tpu_v5e_chip),
    "colab-cpu": (dict(COLAB_ENV), colab_kernel_cpu),
    "kaggle-gpu": (dict(KAGGLE_ENV), fake_two_t4_gpus),
    "kaggle-tpu": (dict(KAGGLE_ENV, TPU_ACCELERATOR_TYPE="v3-8", TPU_PROCESS_ADDRESSES="local:8476",
                        CLOUD_TPU_TASK_ID="0"), fake_tpu_v3_8_chips),
    "kaggle-cpu": (dict(KAGGLE_ENV), no_devices_in_kernel),
    "jupyterlab": ({"JPY_SESSION_NAME": "/home/me/train.ipynb"},
                   Probe(shell_class=KERNEL, in_kernel=True,
                         server_cmdline="/usr/bin/python3 /usr/local/bin/jupyter-lab --no-browser")),
    "notebook": ({"JPY_SESSION_NAME": "/home/me/train.ipynb"},
                 Probe(shell_class=KERNEL, in_kernel=True,
                       server_cmdline="/usr/bin/python3 /usr/local/bin/jupyter-notebook")),
    "vscode": ({"VSCODE_PID": "4242", "VSCODE_CWD": "/home/me", "PYDEVD_IPYTHON_COMPATIBLE_DEBUGGING": "1"},
               Probe(shell_class=KERNEL, in_kernel=True,
                     server_cmdline="/home/me/.vscode-server/bin/abc/node --ms-enable-electron-run-as-node")),
    "ipython-terminal": ({"TERM": "xterm-256color"}, Probe(shell_class=TERMINAL)),
    "script": ({"HOME": "/home/me"}, Probe()),
}


def test_every_platform_has_a_fixture():
    assert set(CASES) == set(PLATFORMS)


@pytest.mark.parametrize("expected", sorted(CASES))
def test_detect_names_the_platform(expected):
    environ, probe = CASES[expected]
    found = detect(environ, probe)
    assert found.platform == expected
    assert found.evidence, "detection must say why"


def test_kaggle_two_t4s():
    found = detect(*CASES["kaggle-gpu"])
    assert (found.device_kind, found.device_count, found.gpu_names) == ("cuda", 2, ("Tesla T4", "Tesla T4"))
    assert not found.has_tpu and found.frontend == "notebook" and found.hosted == "kaggle"
    assert found.describe() == "kaggle-gpu: 2 CUDA GPU(s) (Tesla T4)"


def test_kaggle_tpu_is_xla_with_four_chips():
    found = detect(*CASES["kaggle-tpu"])
    assert found.has_tpu and found.device_kind == "xla" and found.device_count == 4
    assert found.gpu_names == ()


def test_tpu_known_from_environment_alone_counts_chips_from_the_slice_name():
    environ = dict(KAGGLE_ENV, TPU_ACCELERATOR_TYPE="v3-8")
    found = detect(environ, no_devices_in_kernel)
    assert (found.platform, found.device_kind, found.device_count) == ("kaggle-tpu", "xla", 4)
    assert detect({"PJRT_DEVICE": "TPU"}, Probe()).has_tpu
    assert not detect({"PJRT_DEVICE": "CPU"}, Probe()).has_tpu


@pytest.mark.parametrize("slice_name, chips", [("v2-8", 4), ("v3-8", 4), ("v4-8", 4), ("v5litepod-8", 8),
                                               ("v6e-1", 1), ("v5e-4", 4), ("", 0), ("nonsense", 0)])
def test_tpu_chips_from_slice_name(slice_name, chips):
    assert tpu_detection.slice_chips(slice_name) == chips


def test_colab_gpu_and_cpu_runtimes():
    gpu = detect(*CASES["colab-gpu"])
    assert (gpu.device_kind, gpu.device_count, gpu.hosted) == ("cuda", 1, "colab")
    cpu = detect(*CASES["colab-cpu"])
    assert (cpu.device_kind, cpu.device_count, cpu.has_tpu) == ("cpu", 0, False)


def test_colab_recognized_by_its_shell_even_without_variables():
    assert detect({}, colab_kernel_cpu).platform == "colab-cpu"


def test_jupyter_lab_started_from_a_vscode_terminal_is_still_jupyterlab():
    environ = {"VSCODE_IPC_HOOK_CLI": "/tmp/vscode-ipc.sock", "TERM_PROGRAM": "vscode"}
    probe = Probe(shell_class=KERNEL, in_kernel=True, server_cmdline="python -m jupyterlab --port 8888")
    assert detect(environ, probe).platform == "jupyterlab"


def test_kernel_of_unknown_frontend_is_a_notebook():
    found = detect({}, no_devices_in_kernel)
    assert (found.platform, found.frontend) == ("notebook", "notebook")


def test_frontends():
    assert detect(*CASES["ipython-terminal"]).frontend == "terminal"
    assert detect(*CASES["script"]).frontend == "script"


def test_tpu_device_files_are_counted(tmp_path):
    fake_tpu_dev_dir = tmp_path
    for i in range(4):
        (fake_tpu_dev_dir / f"accel{i}").touch()
    (fake_tpu_dev_dir / "accelerator_notes").touch()
    assert tpu_detection.count_tpu_device_files(str(fake_tpu_dev_dir)) == 4
    assert tpu_detection.count_tpu_device_files(str(tmp_path / "missing")) == 0


def test_vfio_tpu_chips_count_only_on_a_tpu_vm(tmp_path, monkeypatch):
    fake_tpu_v5e_vfio_dev_dir = tmp_path
    (fake_tpu_v5e_vfio_dev_dir / "vfio").mkdir()
    for name in ("vfio", "0", "1", "2", "3"):
        (fake_tpu_v5e_vfio_dev_dir / "vfio" / name).touch()
    for key in [k for k in os.environ if k.startswith("TPU_")]:
        monkeypatch.delenv(key)
    monkeypatch.setattr(tpu_detection, "_tpu_vm", lambda *a, **k: False)   # a GPU passthrough host
    assert tpu_detection.count_tpu_device_files(str(fake_tpu_v5e_vfio_dev_dir)) == 0
    monkeypatch.undo()
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-4")
    assert tpu_detection.count_tpu_device_files(str(fake_tpu_v5e_vfio_dev_dir)) == 4


def test_real_process_is_a_script_and_detection_leaves_cuda_alone():
    found = detect()
    assert found.platform == "script" and found.frontend == "script"
    assert found.device_kind == ("cuda" if torch.cuda.device_count() else "cpu")
    assert not torch.cuda.is_initialized()


def test_environment_is_frozen():
    found = detect(*CASES["script"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        found.platform = "colab-gpu"  # type: ignore[misc]  # on purpose: a frozen field refuses it
    assert isinstance(found, Environment)


def test_launch_summary_names_platform_backend_and_display(tmp_path):
    plan = build_plan(num_processes=2, num_nodes=1, node_rank=0, master_addr="127.0.0.1",
                      master_port=29500, device_kind="cuda", mixed_precision="no",
                      start_method="fork", run_id="r", user_env={}, cpu_count=4)
    line = launch_summary(plan, "fork", tmp_path, platform="kaggle-gpu", display="widget")
    assert line == (f"notebook_launch: 2 ranks on kaggle-gpu (CUDA GPU, nccl, fork), port 29500, "
                    f"display widget; logs: {tmp_path}")


def test_the_plans_notes_come_before_the_line_they_explain(tmp_path):
    """'port 29500 is busy; using port 29501 instead' is said before the line that uses 29501
    (issue 35), not after it."""
    plan = build_plan(num_processes=2, num_nodes=1, node_rank=0, master_addr="127.0.0.1",
                      master_port=29501, device_kind="cpu", mixed_precision="no", start_method="fork",
                      run_id="r", user_env={}, cpu_count=4, notes=["port 29500 is busy; using port 29501 instead"])
    lines = launch_summary(plan, "fork", tmp_path, display="text").splitlines()
    assert lines[0] == "notebook_launch: port 29500 is busy; using port 29501 instead"
    assert lines[1].startswith("notebook_launch: 2 ranks (CPU, gloo, fork), port 29501, display text")


def test_display_name():
    from notebook_launch.display import Display, TextDisplay
    assert TextDisplay().name == "text"
    assert Display().name == "none"


def test_a_real_launch_prints_the_platform_line(tmp_path, capsys):
    def work():
        return 7

    assert notebook_launcher(work, num_processes=1, log_dir=str(tmp_path), ui="none") == [7]
    out = capsys.readouterr().out
    start = "fork" if sys.platform.startswith("linux") else "spawn"
    assert f"notebook_launch: 1 rank on script (CPU, gloo, {start}), port " in out
    assert "display none; logs: " in out


# --- a drop-in for Accelerate's notebook_launcher: the variables its ranks get, ours get ----------

def _dict_keys_in_source(function, variable: str) -> set[str]:
    """The keys of ``variable = dict(k=...)`` / ``variable = {"K": ...}`` in ``function``'s source
    (read from the installed library, so a new variable there shows up here)."""
    import ast
    import inspect
    import textwrap
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    keys: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == variable for t in node.targets):
            value = node.value
            if isinstance(value, ast.Call):
                keys |= {kw.arg.upper() for kw in value.keywords if kw.arg}
            elif isinstance(value, ast.Dict):
                keys |= {k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Subscript)
                and getattr(node.targets[0].value, "id", None) == variable
                and isinstance(node.targets[0].slice, ast.Constant)
                and isinstance(node.targets[0].slice.value, str)):
            keys.add(node.targets[0].slice.value.upper())
    return keys


def accelerate_rank_variables() -> set[str]:
    """What a rank started by Accelerate's notebook_launcher finds: the variables the launcher patches
    into the notebook's environment (accelerate/launchers.py), what torch elastic's agent gives each
    worker (it launches through elastic_launch), and what PrepareForLaunch sets (its TPU path)."""
    import accelerate.launchers
    import accelerate.utils.launch
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    patched = _dict_keys_in_source(accelerate.launchers.notebook_launcher, "patched_env")
    worker = _dict_keys_in_source(LocalElasticAgent._start_workers, "worker_env")
    prepare = {"FORK_LAUNCHED"} if "FORK_LAUNCHED" in __import__("inspect").getsource(
        accelerate.utils.launch.PrepareForLaunch) else set()
    assert {"NPROC", "MIXED_PRECISION", "MASTER_PORT"} <= patched, patched   # the parser still reads it
    assert {"RANK", "TORCHELASTIC_RUN_ID"} <= worker, worker
    return patched | worker | prepare | {"LOCAL_RANK"}   # LOCAL_RANK: _set_local_rank_env


@pytest.mark.parametrize("device_kind", ["cpu", "cuda", "xla"])
def test_rank_environment_has_every_variable_accelerates_launcher_gives_or_says_why_not(device_kind):
    from notebook_launch.wire.plan import ACCELERATE_VARIABLE_DIFFERENCES
    plan = build_plan(num_processes=2, num_nodes=1, node_rank=0, master_addr="127.0.0.1", master_port=29511,
                      device_kind=device_kind, mixed_precision="bf16", start_method="fork", run_id="run-7",
                      user_env={}, cpu_count=4, gpu_names=("NVIDIA GeForce RTX 4090",), driver_version="535.1")
    env = plan.ranks[1].env
    explained = {name.strip() for row in ACCELERATE_VARIABLE_DIFFERENCES for name in row[0].split(",")}
    expected = accelerate_rank_variables()
    if device_kind != "cuda":   # Accelerate's P2P/IB switches are for GPUs only, as ours
        expected -= {"NCCL_P2P_DISABLE", "NCCL_IB_DISABLE"}
    missing = sorted(name for name in expected if name not in env and name not in explained)
    assert missing == [], "set these in plan.rank_environment or explain them in ACCELERATE_VARIABLE_DIFFERENCES"
    assert (env["NPROC"], env["MIXED_PRECISION"], env["ACCELERATE_MIXED_PRECISION"]) == ("2", "bf16", "bf16")
    assert (env["RANK"], env["LOCAL_RANK"], env["NODE_RANK"], env["WORLD_SIZE"]) == ("1", "1", "0", "2")
    assert env["TORCHELASTIC_RUN_ID"] == "run-7" and "TORCHELASTIC_USE_AGENT_STORE" not in env
    assert ("FORK_LAUNCHED" in env) == (device_kind == "xla")


def test_every_difference_from_accelerate_names_a_variable_of_either_launcher():
    from notebook_launch.wire.plan import ACCELERATE_VARIABLE_DIFFERENCES
    ours = build_plan(num_processes=1, num_nodes=1, node_rank=0, master_addr="127.0.0.1", master_port=29511,
                      device_kind="xla", mixed_precision="no", start_method="xla", run_id="r",
                      user_env={}, cpu_count=1).ranks[0].env
    known = accelerate_rank_variables() | set(ours) | {"ACCELERATE_USE_CPU"}
    for name, accelerates, mine, why in ACCELERATE_VARIABLE_DIFFERENCES:
        assert why and accelerates and mine
        assert all(part.strip() in known for part in name.split(",")), name


def test_users_own_nccl_error_handling_is_kept():
    plan = build_plan(num_processes=1, num_nodes=1, node_rank=0, master_addr="127.0.0.1", master_port=29511,
                      device_kind="cuda", mixed_precision="no", start_method="fork", run_id="r",
                      user_env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}, cpu_count=1)
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in plan.ranks[0].env   # inherited as the user set it
