"""The HTTP face of one simulated replica: vLLM's OpenAI surface, /metrics, faults, the real-time driver.

Modules, one concept each: `errors` (vLLM's error body), `openai_schema` (request validation),
`sse` (chunk byte templates), `bodies` (non-streaming JSON), `stops` (stop strings), `adapters` (the
served models and LoRA adapters), `driver` (runs an engine in wall time), `metrics` (vLLM's /metrics),
`faults` (faults on demand), `asgi` (raw-ASGI helpers), `generation` (the completion handlers), `app`
(the routes), `replica` (wires one replica together), `server` (uvicorn on a pre-bound socket).
"""
