"""The simulated fleet `kvgate up` runs as a child process, and the config that points at it."""

from __future__ import annotations

import subprocess
import sys
import threading

from gateway.config import Config, ReplicaConfig, SimulatorConfig

START_TIMEOUT_S = 30.0


class FleetStartError(RuntimeError):
    pass


def sim_command(sim: SimulatorConfig) -> list[str]:
    cmd = [
        sys.executable, "-m", "gateway.cli", "sim",
        "--replicas", str(sim.replicas), "--port", "0", "--profile", sim.profile,
        "--time-scale", str(sim.time_scale), "--block-size", str(sim.block_size),
        "--max-num-seqs", str(sim.max_num_seqs),
    ]  # fmt: skip
    if sim.model:
        cmd += ["--model", sim.model]
    if sim.kv_blocks:
        cmd += ["--kv-blocks", str(sim.kv_blocks)]
    if sim.max_loras:
        cmd += ["--max-loras", str(sim.max_loras)]
    if sim.adapters:
        cmd += ["--adapters", ",".join(sim.adapters)]
    return cmd


def sim_model_name(sim: SimulatorConfig) -> str:
    if sim.model:
        return sim.model
    from simulator.profiles import get_profile

    return get_profile(sim.profile).model_name


def with_simulated_replicas(config: Config, sim: SimulatorConfig, urls: list[str]) -> Config:
    model = sim_model_name(sim)
    replicas = tuple(ReplicaConfig(url=u, model=model, name=f"sim-{i}") for i, u in enumerate(urls))
    return config.model_copy(update={"replicas": replicas, "simulator": sim})


class EmbeddedFleet:
    """`kvgate sim` as a child process; `start()` returns its replica URLs, `stop()` ends it."""

    def __init__(self, sim: SimulatorConfig) -> None:
        self._sim = sim
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> list[str]:
        self._proc = subprocess.Popen(
            sim_command(self._sim), stdout=subprocess.PIPE, stderr=None, text=True, bufsize=1
        )
        urls: list[str] = []
        timer = threading.Timer(START_TIMEOUT_S, self._proc.kill)
        timer.start()
        try:
            assert self._proc.stdout is not None
            while len(urls) < self._sim.replicas:
                line = self._proc.stdout.readline()
                if not line:
                    raise FleetStartError(f"exit code {self._proc.poll()}")
                line = line.strip()
                if line.startswith("http://"):
                    urls.append(line)
        finally:
            timer.cancel()
        return urls

    def stop(self) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
