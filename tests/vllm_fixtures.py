"""Where the captured vLLM fixtures live inside the repository (see tests/fixtures/README.md)."""

from pathlib import Path

VLLM_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "vllm-0.32-cpu"
