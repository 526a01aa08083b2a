"""One dtype policy for every service that loads the policy (services/model/load.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from services.model.load import default_dtype, load_causal_lm, parse_dtype
from services.model.tiny import init_model


def test_bf16_on_a_gpu_float32_elsewhere() -> None:
    assert default_dtype("cuda") is torch.bfloat16
    assert default_dtype(torch.device("cuda", 0)) is torch.bfloat16
    assert default_dtype("cpu") is torch.float32


def test_a_dtype_setting_is_a_known_name_or_empty() -> None:
    assert parse_dtype("") is None
    assert parse_dtype("bfloat16") is torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype 'bf16': one of float32, bfloat16"):
        parse_dtype("bf16")


def test_loads_in_the_policys_dtype_unless_told(tmp_path: Path) -> None:
    model_dir = init_model(tmp_path / "policy")
    model = load_causal_lm(model_dir)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    half = load_causal_lm(model_dir, "cpu", torch.bfloat16)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}


def test_every_service_loads_through_it() -> None:
    """No service loads a model its own way (the dtype policy would split again)."""
    services = Path(__file__).resolve().parents[2] / "services"
    outside = [
        str(path.relative_to(services))
        for path in services.rglob("*.py")
        if "from_pretrained(" in path.read_text() and path.parent.name != "model"
    ]
    assert outside == []
