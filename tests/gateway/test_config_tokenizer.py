"""`models[].tokenizer` as a directory: where a relative path points, and `kvgate check-config` (every
command's loader) refusing a directory without a usable tokenizer, with the path and the reason."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.config import ConfigError, parse_config
from gateway.config_check import checked_from_text, load_checked
from tests.vllm_fixtures import VLLM_FIXTURES

FIXTURE = VLLM_FIXTURES / "tiny-llama-tokenizer"


def write_config(path: Path, tokenizer: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"models: [{{name: m, tokenizer: {tokenizer!r}}}]\n")
    return path


def test_a_relative_directory_is_taken_from_the_config_files_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(FIXTURE, tmp_path / "etc" / "models" / "tok")
    cfg = write_config(tmp_path / "etc" / "kvgate" / "kvgate.yaml", "../models/tok")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # not where the config is
    expected = str(tmp_path / "etc" / "models" / "tok")
    assert load_checked(cfg).models[0].tokenizer == expected
    assert load_checked("../etc/kvgate/kvgate.yaml").models[0].tokenizer == expected  # a relative config path
    # A reload checks the bytes it read the same way.
    assert checked_from_text(cfg.read_text(), str(cfg)).models[0].tokenizer == expected
    # Through a symlink (a ConfigMap's file is one): the link's directory, not its target's.
    link_dir = tmp_path / "etc" / "link"
    link_dir.mkdir()
    (link_dir / "kvgate.yaml").symlink_to(cfg)
    shutil.copytree(FIXTURE, tmp_path / "etc" / "models" / "tok2")
    write_config(cfg, "../models/tok2")
    assert load_checked(link_dir / "kvgate.yaml").models[0].tokenizer == str(
        tmp_path / "etc" / "models" / "tok2"
    )


def test_absolute_none_and_sim_are_kept_and_without_a_file_the_working_directory_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    models = [{"name": "a", "tokenizer": "none"}, {"name": "b", "tokenizer": "sim"},
              {"name": "c", "tokenizer": str(FIXTURE)}, {"name": "d", "tokenizer": "tok"}]  # fmt: skip
    got = [m.tokenizer for m in parse_config({"models": models}).models]
    assert got == ["none", "sim", str(FIXTURE), str(tmp_path / "tok")]
    with pytest.raises(ConfigError, match=r"models\.0\.tokenizer"):
        parse_config({"models": [{"name": "a", "tokenizer": ""}]})


@pytest.mark.parametrize(
    ("setup", "reason"),
    [("missing", "no such directory"), ("file", "not a directory"), ("empty", "no tokenizer.json"),
     ("broken", "tokenizer.json: the tokenizers library cannot load it")],
)  # fmt: skip
def test_check_config_refuses_a_directory_without_a_usable_tokenizer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], setup: str, reason: str
) -> None:
    target = tmp_path / "tok"
    if setup == "file":
        target.write_text("x")
    elif setup == "empty":
        target.mkdir()
    elif setup == "broken":
        shutil.copytree(FIXTURE, target)
        (target / "tokenizer.json").write_text('{"version": "1.0"}')
    cfg = write_config(tmp_path / "kvgate.yaml", "tok")
    assert main(["check-config", str(cfg)]) == 1
    err = capsys.readouterr().err
    assert f"models.0.tokenizer: {target}" in err and reason in err


def test_check_config_accepts_a_tokenizer_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(FIXTURE, tmp_path / "tok")
    assert main(["check-config", str(write_config(tmp_path / "kvgate.yaml", "./tok"))]) == 0
    assert "ok" in capsys.readouterr().out
