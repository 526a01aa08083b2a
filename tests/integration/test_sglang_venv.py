"""The CPU SGLang venv recipe: cache key, location, and the two test-environment shims.

No venv is built here: the shims are imported from deploy/sglang-cpu/shims in a child
interpreter (so this process never sees a fake torchvision).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from services.engines.sglang import server as sglang_server
from services.engines.sglang.server import (
    DEPLOY_DIR,
    POINTER_NAME,
    STAMP_NAME,
    SGLangServerError,
    sglang_python,
    venv_hash,
)

BUILD = DEPLOY_DIR / "build.sh"


def test_python_computes_the_same_cache_key_as_build_sh() -> None:
    printed = subprocess.run(
        [str(BUILD), "--print-hash"], capture_output=True, text=True, check=True, timeout=30
    )
    assert printed.stdout.strip() == venv_hash()
    assert len(venv_hash()) == 16


def test_the_cache_key_covers_requirements_shims_and_the_script(tmp_path: Path) -> None:
    copy = tmp_path / "sglang-cpu"
    subprocess.run(["cp", "-r", str(DEPLOY_DIR), str(copy)], check=True)
    keys = {venv_hash(copy)}
    for name in ("requirements.txt", "build.sh", "shims/sgl_kernel/__init__.py"):
        with (copy / name).open("a") as file:
            file.write("\n# changed\n")
        keys.add(venv_hash(copy))
    assert len(keys) == 4


def _fake_venv(root: Path, complete: bool) -> Path:
    python = root / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    if complete:
        (root / STAMP_NAME).touch()
    return python


def test_located_by_hash_only_when_its_build_completed(tmp_path: Path) -> None:
    env = {"TEMPER_CACHE": str(tmp_path)}
    venv = tmp_path / f"sglang-cpu-{venv_hash()}"
    _fake_venv(venv, complete=False)
    assert sglang_python(env) is None, "an interrupted build must not be used"
    (venv / STAMP_NAME).touch()
    assert sglang_python(env) == venv / "bin" / "python"


def test_pointer_file_is_the_fallback(tmp_path: Path) -> None:
    python = _fake_venv(tmp_path / "sglang-cpu-0123456789abcdef", complete=True)
    (tmp_path / POINTER_NAME).write_text(f"{python}\n")
    assert sglang_python({"TEMPER_CACHE": str(tmp_path)}) == python


def test_explicit_python_wins_and_must_exist(tmp_path: Path) -> None:
    python = _fake_venv(tmp_path / "elsewhere", complete=False)
    assert sglang_python({"TEMPER_SGLANG_PYTHON": str(python)}) == python
    with pytest.raises(SGLangServerError, match="not an executable"):
        sglang_python({"TEMPER_SGLANG_PYTHON": str(tmp_path / "missing")})


def test_server_command_is_loopback_cpu_and_raw_logprobs(tmp_path: Path) -> None:
    settings = sglang_server.SGLangServerSettings(model_path=tmp_path, python=Path("/py"))
    command = sglang_server.SGLangServer(settings).command(4321)
    assert command[:3] == ["/py", "-m", "sglang.launch_server"]

    def value(flag: str) -> str:
        return command[command.index(flag) + 1]

    assert value("--host") == "127.0.0.1" and value("--port") == "4321"
    assert value("--device") == "cpu" and value("--dtype") == "float32"
    assert "--disable-cuda-graph" in command
    assert "--sleep-on-idle" in command  # an idle scheduler must not hold a core
    assert sglang_server.SERVER_ENV["SGLANG_RETURN_ORIGINAL_LOGPROB"] == "1"


def _run_with_shims(code: str) -> subprocess.CompletedProcess[str]:
    # No bytecode: a __pycache__ in shims/ would be copied into the venv.
    env = {**os.environ, "PYTHONPATH": str(DEPLOY_DIR / "shims"), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_sgl_kernel_shim_imports_and_raises_when_called() -> None:
    result = _run_with_shims(
        """
        import sgl_kernel
        from sgl_kernel import copy_all_layer_kv_cache_cpu
        try:
            copy_all_layer_kv_cache_cpu(1, 2)
        except sgl_kernel.ShimKernelCalled as error:
            print("raised:", error)
        try:
            from sgl_kernel import flash_attn_varlen_func
        except ImportError:
            print("unknown names are missing")
        try:
            import sgl_kernel.scalar_type
        except ImportError:
            print("unknown modules are missing")
        """
    )
    assert result.returncode == 0, result.stderr
    assert "raised: sgl_kernel.copy_all_layer_kv_cache_cpu was called" in result.stdout
    assert "Temper test shim" in result.stdout
    # SGLang's own `except ImportError` fallbacks must still take over.
    assert "unknown names are missing" in result.stdout
    assert "unknown modules are missing" in result.stdout


def test_torchvision_shim_imports_and_raises_when_used() -> None:
    result = _run_with_shims(
        """
        import torchvision
        import torchvision.transforms as T
        import torchvision.transforms.v2.functional as F2
        from torchvision.transforms import InterpolationMode, functional as F
        from torchvision.io import decode_jpeg
        assert "shim" in torchvision.__version__
        assert InterpolationMode.BICUBIC.value == "bicubic"
        assert F2.InterpolationMode is InterpolationMode
        try:
            T.Compose([T.Resize(8)])
        except RuntimeError as error:
            print("raised:", error)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "raised: torchvision.transforms.Resize was called" in result.stdout
