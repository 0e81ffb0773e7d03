"""The bench's child processes: the layout on N CPUs, stopping stubborn children, no orphan when the
bench itself is killed, and the simulator and gateway children over loopback."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from loadtests.bench_processes import Child, GatewayProcess, SimFleetProcess, choose_layout, cpu_seconds
from loadtests.presets import FleetPlan


def _alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


@pytest.mark.parametrize(
    ("cpus", "pin", "sim", "gateway", "loadgen"),
    [
        ([0, 1], True, (1,), (0,), (0,)),
        ([0, 1, 2, 3], True, (2,), (1,), (0,)),
        ([3], True, None, None, None),
        ([0, 1], False, None, None, None),
    ],
)
def test_layout(
    cpus: list[int],
    pin: bool,
    sim: tuple[int, ...] | None,
    gateway: tuple[int, ...] | None,
    loadgen: tuple[int, ...] | None,
) -> None:
    layout = choose_layout(cpus, pin=pin)
    assert (layout.sim_cpus, layout.gateway_cpus, layout.loadgen_cpus) == (sim, gateway, loadgen)
    assert layout.pinned == (sim is not None) and layout.note
    assert layout.as_meta()["pinned"] == layout.pinned


def test_stop_kills_a_child_that_ignores_sigterm(tmp_path: Path) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); "
        "time.sleep(60)"
    )
    child = Child([sys.executable, "-c", code], tmp_path / "c.log", read_stdout=True)
    assert child.proc.stdout is not None and child.proc.stdout.readline() == b"up\n"
    assert child.stop(timeout_s=0.5) == -signal.SIGKILL
    assert not child.alive() and child.stop() == -signal.SIGKILL  # idempotent


def test_stdout_goes_to_its_file_and_stderr_to_the_log(tmp_path: Path) -> None:
    code = "import sys; print('line one'); print('oops', file=sys.stderr)"
    out = tmp_path / "access.log"
    child = Child([sys.executable, "-c", code], tmp_path / "c.log", read_stdout=False, stdout_path=out)
    child.proc.wait(10)
    assert child.stop() == 0
    assert out.read_text() == "line one\n" and (tmp_path / "c.log").read_text() == "oops\n"


def test_stdout_is_piped_or_written_not_both(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not both"):
        Child(
            [sys.executable, "-c", "pass"], tmp_path / "c.log", read_stdout=True, stdout_path=tmp_path / "o"
        )
    assert not (tmp_path / "o").exists()  # refused before anything was opened or started


@pytest.mark.skipif(sys.platform != "linux", reason="parent-death signal is Linux only")
def test_children_die_with_a_killed_bench(tmp_path: Path) -> None:
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from loadtests.bench_processes import Child\n"
        "cmd = [sys.executable, '-c', 'import time; time.sleep(60)']\n"
        "c = Child(cmd, Path(sys.argv[1]), read_stdout=False)\n"
        "print(c.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "c.log")], stdout=subprocess.PIPE)
    assert parent.stdout is not None
    grandchild = int(parent.stdout.readline())
    assert _alive(grandchild)
    parent.kill()
    parent.wait(10)
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


@pytest.mark.timeout(60)
async def test_sim_and_gateway_children_serve_and_stop(tmp_path: Path) -> None:
    plan = FleetPlan(replicas=2, profile="tiny", time_scale=1.0)
    with SimFleetProcess(plan.sim_args(), plan.replicas, None, tmp_path / "sim.log") as fleet:
        assert len(fleet.urls) == 2 and fleet.child is not None
        sim_pid = fleet.child.pid
        config = {
            "server": {"host": "127.0.0.1", "port": 0},
            "replicas": [{"url": u, "model": "tiny-llama"} for u in fleet.urls],
            "scheduling": {"profile": "round-robin"},
        }
        gateway = GatewayProcess(config, tmp_path / "gw.yaml", None, tmp_path / "gw.log")
        async with gateway:
            gw_pid = gateway.pid
            async with aiohttp.ClientSession() as s, s.get(gateway.url + "/v1/models") as resp:
                assert resp.status == 200
                assert (await resp.json())["data"][0]["id"] == "tiny-llama"
            assert cpu_seconds(gw_pid) > 0
        assert not _alive(gw_pid)
    assert not _alive(sim_pid)


def test_a_sim_that_cannot_start_says_why(tmp_path: Path) -> None:
    args = ["sim", "--profile", "no-such-profile", "--port", "0"]
    fleet = SimFleetProcess(args, 1, None, tmp_path / "s.log")
    with pytest.raises(RuntimeError, match="no-such-profile"):
        fleet.start(timeout_s=30)
