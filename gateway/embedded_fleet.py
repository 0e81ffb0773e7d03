"""The simulated fleet `kvgate up` runs as a child process, and the config that points at it."""

from __future__ import annotations

import subprocess
import sys
import threading

from gateway.config import Config, ModelConfig, ReplicaConfig, SimulatorConfig

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
    if sim.kv_events:
        cmd += ["--kv-events-port", "0"]
    return cmd


def sim_model_name(sim: SimulatorConfig) -> str:
    if sim.model:
        return sim.model
    from simulator.profiles import get_profile

    return get_profile(sim.profile).model_name


def with_simulated_replicas(
    config: Config, sim: SimulatorConfig, urls: list[str], kv_events: list[tuple[str, str]] | None = None
) -> Config:
    """`config` in front of the simulated replicas at `urls`; with their KV-event sockets
    (`(pub, replay)` per replica), the pool also gets the simulator's tokenizer unless the config
    gives it one, since the exact index matches the engine's own token ids."""
    model = sim_model_name(sim)
    events = kv_events or []
    replicas = tuple(
        ReplicaConfig(url=u, model=model, name=f"sim-{i}", **_event_sockets(events, i))
        for i, u in enumerate(urls)
    )
    update: dict[str, object] = {"replicas": replicas, "simulator": sim}
    if events:
        models = list(config.models)
        named = [i for i, m in enumerate(models) if m.name == model]
        if not named:
            models.append(ModelConfig(name=model, tokenizer="sim"))
        elif models[named[0]].tokenizer == "none":
            models[named[0]] = models[named[0]].model_copy(update={"tokenizer": "sim"})
        update["models"] = tuple(models)
    return config.model_copy(update=update)


def _event_sockets(events: list[tuple[str, str]], i: int) -> dict[str, str]:
    if i >= len(events):
        return {}
    pub, replay = events[i]
    return {"kv_events": pub, "kv_events_replay": replay}


class EmbeddedFleet:
    """`kvgate sim` as a child process; `start()` returns its replica URLs, `stop()` ends it."""

    def __init__(self, sim: SimulatorConfig) -> None:
        self._sim = sim
        self._proc: subprocess.Popen[str] | None = None
        self.kv_events: list[tuple[str, str]] = []  # (pub, replay) per replica, once started

    def start(self) -> list[str]:
        self._proc = subprocess.Popen(
            sim_command(self._sim), stdout=subprocess.PIPE, stderr=None, text=True, bufsize=1
        )
        urls: list[str] = []
        timer = threading.Timer(START_TIMEOUT_S, self._proc.kill)
        timer.start()
        try:
            assert self._proc.stdout is not None
            wanted_events = self._sim.replicas if self._sim.kv_events else 0
            while len(urls) < self._sim.replicas or len(self.kv_events) < wanted_events:
                line = self._proc.stdout.readline()
                if not line:
                    raise FleetStartError(f"exit code {self._proc.poll()}")
                line = line.strip()
                if line.startswith("http://"):
                    urls.append(line)
                elif line.startswith("kv-events "):
                    fields = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
                    self.kv_events.append((fields["pub"], fields["replay"]))
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
