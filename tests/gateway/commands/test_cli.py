"""The `kvgate` command line: hash-key, check-config, and `kvgate up` end to end."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gateway.cli import main
from loadtests.ports import free_port

ROOT = Path(__file__).resolve().parents[3]


def test_hash_key_from_argument_and_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["hash-key", "s3cret"]) == 0
    expected = "sha256:" + hashlib.sha256(b"s3cret").hexdigest()
    assert capsys.readouterr().out.strip() == expected
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("s3cret\n"))
    assert main(["hash-key"]) == 0
    assert capsys.readouterr().out.strip() == expected


def test_hash_key_new_prints_a_key_and_its_hash(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hash-key", "--new"]) == 0
    key_line, hash_line = capsys.readouterr().out.strip().splitlines()
    key = key_line.split()[-1]
    assert hash_line.split()[-1] == "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def test_check_config_ok_and_invalid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(ROOT / "config" / "fleet.example.yaml")]) == 0
    assert "ok" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("fleet: {scrape_interval_s: -1}\nscheduling: {profile: nope}\n")
    assert main(["check-config", str(bad)]) == 1
    assert "fleet.scrape_interval_s" in capsys.readouterr().err


def test_check_config_warns_when_replica_certificates_are_not_verified(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "insecure.yaml"
    cfg.write_text("replicas: [{url: 'https://10.0.0.1:8443', model: m}]\nupstream: {tls_verify: false}\n")
    assert main(["check-config", str(cfg)]) == 0
    out = capsys.readouterr()
    assert "ok" in out.out
    (warning,) = out.err.strip().splitlines()
    assert "warning" in warning and "upstream.tls_verify" in warning


@pytest.mark.timeout(90)
def test_kvgate_up_serves_a_simulated_fleet_and_stops_on_ctrl_c() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "up",
            "--port",
            str(port),
            "--replicas",
            "2",
            "--profile",
            "tiny",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        ready = False
        while time.monotonic() < deadline and not ready:
            try:
                ready = httpx.get(url + "/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                time.sleep(0.2)
        assert ready, "kvgate up did not become ready"
        r = httpx.post(
            url + "/v1/chat/completions",
            json={"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
            timeout=10,
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        # The simulated replicas publish KV events, and the replica that served is routed on them.
        long_chat = {
            "model": "tiny-llama",
            "messages": [{"role": "user", "content": "tell me " * 200}],
            "max_tokens": 2,
        }
        r = httpx.post(url + "/v1/chat/completions", json=long_chat, timeout=10)  # full blocks to store
        assert r.status_code == 200
        served = r.headers["x-kvgate-replica"]
        exact = f'kvgate_prefix_index_mode{{mode="exact",replica="{served}"}} 1.0'
        deadline = time.monotonic() + 20
        while exact not in httpx.get(url + "/metrics", timeout=5).text:
            assert time.monotonic() < deadline, "the serving replica never went exact"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert f"kvgate is listening on {url}" in out and "curl" in out and "OpenAI(" in out
        # The access log: one JSON line per request, on stdout.
        first, second = [json.loads(x) for x in out.splitlines() if x.startswith('{"ts":')]
        assert first["status"] == 200 and first["completion_tokens"] == 3 and first["model"] == "tiny-llama"
        assert second["replica"] == served and second["completion_tokens"] == 2
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.timeout(90)
def test_kvgate_up_stops_its_fleet_on_sigterm() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "up",
            "--port",
            str(port),
            "--replicas",
            "1",
            "--profile",
            "tiny",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        sim_url = None
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        sim_url = next(
            line.strip()
            for line in out.splitlines()
            if line.strip().startswith("http://127.0.0.1:") and not line.strip().startswith(url)
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with pytest.raises(httpx.HTTPError):
        httpx.get(sim_url + "/health", timeout=2)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", ["serve", "up"])
def test_serve_and_up_refuse_what_check_config_refuses_before_listening(command: str, tmp_path: Path) -> None:
    # serve used to skip the semantic checks: an unknown profile passed, and kvgate failed only in
    # its start-up, after uvicorn had begun. Every command now loads a config through one function.
    port = free_port()
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        f"server: {{port: {port}}}\n"
        "replicas: [{url: 'http://127.0.0.1:9', model: m}]\n"
        "scheduling: {profile: nope}\n"
    )
    assert main(["check-config", str(bad)]) == 1
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", command, "--config", str(bad)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=45,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "scheduling.profile: no profile named 'nope'" in proc.stderr
    assert "kvgate is listening" not in proc.stdout and "Uvicorn" not in proc.stderr


@pytest.mark.timeout(60)
def test_kvgate_serve_applies_the_server_timeouts(tmp_path: Path) -> None:
    # The settings reach uvicorn through serve_forever, not only through the tests' GatewayServer.
    port = free_port()
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(
        f"server: {{port: {port}, header_timeout_s: 0.3}}\n"
        f"replicas: [{{url: 'http://127.0.0.1:{free_port()}', model: m}}]\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: kvgate\r\ncontent-le")
            answer = b""
            while chunk := sock.recv(65536):  # to the close; the socket timeout bounds each wait
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
