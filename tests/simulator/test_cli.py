"""`kvgate sim` in a subprocess: prints one URL per replica, serves them, exits 0 on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def test_sim_serves_and_stops_on_sigterm() -> None:
    command = [sys.executable, "-m", "gateway.cli", "sim", "--replicas", "2", "--port", "0",
               "--profile", "tiny", "--adapters", "a,b"]
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as process:
        try:
            assert process.stdout is not None
            urls = [process.stdout.readline().strip() for _ in range(2)]
            assert all(u.startswith("http://127.0.0.1:") for u in urls)
            with httpx.Client(timeout=5) as client:
                for url in urls:
                    assert client.get(url + "/health").status_code == 200
                models = [m["id"] for m in client.get(urls[0] + "/v1/models").json()["data"]]
                assert models == ["tiny-llama", "a", "b"]
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=20) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def test_sim_rejects_bad_arguments() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "sim", "--port", "0", "--profile", "nope"],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )
    assert result.returncode != 0
    assert "unknown profile" in result.stderr
