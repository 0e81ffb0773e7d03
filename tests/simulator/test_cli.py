"""`kvgate sim` in a subprocess: prints one URL per replica, serves them, exits 0 on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import zmq

from gateway.kv_events.wire import REPLAY_END, BlockStored, decode_message, decode_seq, encode_seq

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


def test_sim_publishes_kv_events_when_asked() -> None:
    """`--kv-events-port 0`: after the URL, a line naming the replica's PUB and replay endpoints; a
    request's blocks can then be replayed from sequence 0 (on the CLI's uvloop)."""
    command = [sys.executable, "-m", "gateway.cli", "sim", "--port", "0", "--block-size", "4",
               "--kv-events-port", "0", "--kv-events-topic", "kv"]
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as process:
        ctx = zmq.Context()
        try:
            assert process.stdout is not None
            url = process.stdout.readline().strip()
            kind, pub, replay = process.stdout.readline().split()
            assert kind == "kv-events" and pub.startswith("pub=tcp://127.0.0.1:")
            assert replay.startswith("replay=tcp://127.0.0.1:")
            with httpx.Client(timeout=5) as client:
                body = {"messages": [{"role": "user", "content": "Hello there, replica!"}], "max_tokens": 2}
                assert client.post(url + "/v1/chat/completions", json=body).status_code == 200
            dealer = ctx.socket(zmq.DEALER)
            dealer.connect(replay.removeprefix("replay="))
            dealer.send_multipart([b"", encode_seq(0)])
            frames = []
            while not frames or decode_seq(frames[-1][1]) != REPLAY_END:
                assert dealer.poll(5000), "no replay answer"
                frames.append(dealer.recv_multipart())
            assert decode_seq(frames[0][1]) == 0
            assert isinstance(decode_message(frames[0]).events[0], BlockStored)
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=20) == 0
        finally:
            ctx.destroy(linger=0)
            if process.poll() is None:
                process.kill()
                process.wait()
