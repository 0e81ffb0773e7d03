import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.prefix import byte_block_keys, seed_for, token_block_keys
from policies.prompt_text import pack_token_ids

SEED = seed_for("llama", None)
DATA = bytes(range(256)) * 40  # 10,240 bytes


def reference_keys(data: bytes, block: int, seed: int) -> tuple[int, ...]:
    keys = []
    key = seed
    for start in range(0, len(data) - block + 1, block):
        key = xxhash.xxh3_64_intdigest(data[start : start + block], seed=key)
        keys.append(key)
    return tuple(keys)


@pytest.mark.parametrize("block", [1, 7, 16, 256, 1000, 10_240, 10_241])
def test_matches_the_plain_chained_definition(block: int) -> None:
    assert byte_block_keys(DATA, block, SEED) == reference_keys(DATA, block, SEED)


@pytest.mark.parametrize("blocks", [1, 63, 64, 65, 128, 129, 300])  # across the struct cut of 64 blocks
def test_many_blocks_match_the_definition(blocks: int) -> None:
    data = (b"0123456789abcdef" * 4)[: 16 * 3] * (blocks + 1)
    assert byte_block_keys(data[: blocks * 16], 16, SEED) == reference_keys(data[: blocks * 16], 16, SEED)


@pytest.mark.parametrize(
    ("length", "block", "count"),
    [(0, 16, 0), (15, 16, 0), (16, 16, 1), (31, 16, 1), (32, 16, 2), (1000, 256, 3)],
)
def test_full_blocks_only(length: int, block: int, count: int) -> None:
    assert len(byte_block_keys(DATA[:length], block, SEED)) == count


def test_a_partial_tail_does_not_change_the_keys() -> None:
    assert byte_block_keys(DATA[:512] + b"tail", 256, SEED) == byte_block_keys(DATA[:512], 256, SEED)


@pytest.mark.parametrize("changed_block", [0, 1, 5, 9])
def test_a_change_in_block_i_changes_keys_from_i_on_only(changed_block: int) -> None:
    block = 64
    original = DATA[: 10 * block]
    position = changed_block * block + 3
    changed = original[:position] + bytes([original[position] ^ 1]) + original[position + 1 :]
    a = byte_block_keys(original, block, SEED)
    b = byte_block_keys(changed, block, SEED)
    assert a[:changed_block] == b[:changed_block]
    assert all(x != y for x, y in zip(a[changed_block:], b[changed_block:], strict=True))


def test_same_prefix_same_leading_keys() -> None:
    a = byte_block_keys(DATA[:1024] + b"A" * 512, 128, SEED)
    b = byte_block_keys(DATA[:1024] + b"B" * 512, 128, SEED)
    assert a[:8] == b[:8] and a[8:] != b[8:]


def test_key_i_names_the_whole_prefix_not_just_block_i() -> None:
    # the same block at the same position after different prefixes gets different keys
    a = byte_block_keys(b"x" * 16 + b"same" * 4, 16, SEED)
    b = byte_block_keys(b"y" * 16 + b"same" * 4, 16, SEED)
    assert a[1] != b[1]


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (("llama", None), ("qwen", None)),
        (("llama", None), ("llama", "sql")),
        (("llama", "sql"), ("llama", "chat")),
        (("llama", ""), ("llama", None)),
        (("ab", "c"), ("a", "bc")),
    ],
)
def test_seed_separates_models_and_adapters(
    one: tuple[str, str | None], other: tuple[str, str | None]
) -> None:
    assert seed_for(*one) != seed_for(*other)
    assert byte_block_keys(DATA, 64, seed_for(*one))[0] != byte_block_keys(DATA, 64, seed_for(*other))[0]


def test_seed_is_stable() -> None:
    assert seed_for("llama", "sql") == seed_for("llama", "sql")
    assert 0 <= seed_for("llama", None) < 2**64


def test_token_path_is_the_byte_path_over_packed_ids() -> None:
    ids = list(range(1000, 1000 + 200))
    keys = token_block_keys(ids, 16, SEED)
    assert len(keys) == 12  # 200 // 16 full blocks
    assert keys == byte_block_keys(pack_token_ids(ids), 16 * 4, SEED)
    assert token_block_keys(ids[:192], 16, SEED) == keys
    assert token_block_keys(ids[:15], 16, SEED) == ()


def test_token_path_chain_property() -> None:
    a = token_block_keys([1] * 64 + [2] * 64, 64, SEED)
    b = token_block_keys([1] * 64 + [3] * 64, 64, SEED)
    assert a[0] == b[0] and a[1] != b[1]


@pytest.mark.parametrize("size", [0, -16])
def test_block_size_must_be_positive(size: int) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        byte_block_keys(DATA, size, SEED)
    with pytest.raises(ValueError, match="must be positive"):
        token_block_keys([1, 2], size, SEED)


def test_accepts_memoryview() -> None:
    assert byte_block_keys(memoryview(DATA), 256, SEED) == byte_block_keys(DATA, 256, SEED)


# Literal keys, computed by the definition in force when they were written (xxh3_64 of block i seeded
# by key i-1, key 0 seeded by `seed_for`). A change of implementation must keep them: the keys name
# prefixes in every running gateway's index and in the engines' KV events' exact-key mapping.
PINNED_SEED = 11295404619576603173  # seed_for("llama-3-8b", None)


def test_pinned_seeds() -> None:
    assert seed_for("llama-3-8b", None) == PINNED_SEED
    assert seed_for("llama-3-8b", "sql") == 16749727085675360982


def test_pinned_byte_keys() -> None:
    assert byte_block_keys(DATA[: 256 * 3 + 5], 256, PINNED_SEED) == (
        18371211670851689417,
        12873947391028781402,
        10164541067240065050,
    )
    assert byte_block_keys(DATA, 4096, 16749727085675360982) == (11532983241746748292, 9274992212089017717)


def test_pinned_byte_keys_across_the_struct_cut() -> None:
    keys = byte_block_keys(DATA, 16, PINNED_SEED)
    assert len(keys) == 640
    assert keys[63:66] == (893407371863793011, 10360927180480935094, 16590669891742964360)
    assert keys[-1] == 16217518073571934861


def test_pinned_token_keys() -> None:
    assert token_block_keys(list(range(100)), 16, PINNED_SEED)[:3] == (
        6971691596987686841,
        16927924542964865368,
        7234850279761552627,
    )


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=3000),
    block=st.integers(min_value=1, max_value=300),
    seed=st.integers(min_value=0, max_value=2**64 - 1),
)
def test_the_chain_equals_the_plain_definition_on_any_input(data: bytes, block: int, seed: int) -> None:
    assert byte_block_keys(data, block, seed) == reference_keys(data, block, seed)
