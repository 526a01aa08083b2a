"""``temper model init``: a tiny policy directory every engine and the learner can load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from services.cli import main
from services.model.tiny import SPECIAL_TOKENS, ModelDirError, init_model
from services.model.tokens import ChatTokenizer
from services.model.weights import DigestMismatch, directory_digest, verify_digest


def test_directory_is_hugging_face_format(tiny_model: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    names = {p.name for p in tiny_model.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    config = json.loads((tiny_model / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["num_hidden_layers"] == 2
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    assert 1500 <= len(tokenizer) <= 2048
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model))
    assert model.dtype == torch.float32
    logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, config["vocab_size"])


def test_tokenizer_round_trips_any_text_and_renders_chatml(tiny_model: Path) -> None:
    tok = ChatTokenizer.load(tiny_model)
    text = "ünïcode \U0001d4c1 and code: print({'a': 1})\n\t<answer>42</answer>"
    assert tok.decode(tok.encode(text)) == text
    for special in SPECIAL_TOKENS:
        assert len(tok.encode(special)) == 1
    from protocol.messages import ChatMessage

    rendered = tok.decode(tok.render([ChatMessage(role="user", content="hi")]))
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.tool_call_end_id is not None and tok.eos_ids


def test_same_seed_same_weights_other_seed_other_weights(tmp_path: Path) -> None:
    a = init_model(tmp_path / "a")
    b = init_model(tmp_path / "b")
    assert directory_digest(a) == directory_digest(b)
    verify_digest(a, directory_digest(b))
    from services.model.tiny import TinyModelSpec

    other = init_model(tmp_path / "other", TinyModelSpec(seed=3))
    with pytest.raises(DigestMismatch, match="digest"):
        verify_digest(other, directory_digest(a))


def test_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(ModelDirError, match="not empty"):
        init_model(tmp_path)
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_cli_init_and_its_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "m"
    assert main(["model", "init", str(target), "--layers", "1", "--hidden", "64"]) == 0
    assert json.loads((target / "config.json").read_text())["hidden_size"] == 64
    assert main(["model", "init", str(target)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(["model", "init", str(tmp_path / "x"), "--hidden", "30"]) == 2


def test_digest_of_a_directory_without_weights_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no weight files"):
        directory_digest(tmp_path)
