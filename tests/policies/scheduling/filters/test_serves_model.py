from policies.scheduling.filters.serves_model import ServesModelFilter
from tests.policies.scheduling.builders import context, names, replica


def test_keeps_the_request_pool_only() -> None:
    candidates = [replica("a", pool="llama"), replica("b", pool="qwen"), replica("c", pool="llama")]
    assert names(ServesModelFilter().filter(context(base_model="llama"), candidates)) == ["a", "c"]
    assert names(ServesModelFilter().filter(context(base_model="mistral"), candidates)) == []
    assert ServesModelFilter.soft is False
