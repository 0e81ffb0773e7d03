"""The served-model registry: vLLM's names, checks and wording for adapters."""

from __future__ import annotations

import orjson
import pytest

from simulator.server.adapters import ModelRegistry
from simulator.server.errors import ApiError


def registry(lora: bool = True) -> ModelRegistry:
    return ModelRegistry("base", 1024, lora_enabled=lora, adapters={"a": "/models/a"} if lora else None)


@pytest.mark.parametrize(("model", "adapter"), [(None, None), ("base", None), ("a", "a")])
def test_resolve(model: str | None, adapter: str | None) -> None:
    assert registry().resolve(model) == adapter


def test_unknown_model_is_404_with_vllms_message() -> None:
    with pytest.raises(ApiError) as info:
        registry().resolve("x")
    assert info.value.status == 404
    assert info.value.message == "The model `x` does not exist. Valid aliases: base."


@pytest.mark.parametrize(
    ("name", "path", "status"),
    [("a", "/p", 400), ("base", "/p", 400), ("", "/p", 400), ("b", None, 400), (3, "/p", 400)],
)
def test_bad_loads(name: object, path: object, status: int) -> None:
    with pytest.raises(ApiError) as info:
        registry().load(name, path)
    assert info.value.status == status


def test_load_unload_and_list() -> None:
    models = registry()
    assert models.load("b", "/x/b") == "Success: LoRA adapter 'b' added successfully."
    listed = orjson.loads(models.models_body())["data"]
    assert [(m["id"], m["parent"], m["root"]) for m in listed] == [
        ("base", None, "/models/base"), ("a", "base", "/models/a"), ("b", "base", "/x/b")]
    assert models.unload("a").startswith("Success")
    assert models.adapters == ("b",)
    with pytest.raises(ApiError) as info:
        models.unload("a")
    assert info.value.status == 404


def test_loading_needs_lora() -> None:
    with pytest.raises(ApiError) as info:
        registry(lora=False).load("b", "/b")
    assert info.value.status == 400


def test_each_load_gets_the_next_integer_id_as_vllms_lora_int_id() -> None:
    models = registry()
    models.load("b", "/models/b")
    assert [models.lora_int_id(n) for n in (None, "a", "b", "x")] == [None, 1, 2, None]
    models.unload("a")
    models.load("a", "/models/a")
    assert models.lora_int_id("a") == 3  # loaded again: a new id, never a reused one
