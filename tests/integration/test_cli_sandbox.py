"""``temper sandbox exec`` against a running sandbox service (bubblewrap: no image needed)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.runtime.settings import RuntimeSettings
from services.sandbox.service import SandboxService
from services.sandbox.settings import SandboxSettings
from tests.integration.test_cli_harness import finish, start


@pytest.fixture
async def sandbox_url(nats_url: str) -> AsyncIterator[str]:
    settings = SandboxSettings(
        runtime=RuntimeSettings(nats_url=nats_url, heartbeat_s=0.5),
        backend="bwrap",
        pool_size=1,
        state_dir=Path(tempfile.mkdtemp(prefix="tcs-")),
    )
    async with SandboxService(settings):
        yield nats_url


async def test_exec_code_prints_output_and_exits_with_its_code(sandbox_url: str) -> None:
    done = await finish(await start(sandbox_url, "sandbox", "exec", "-c", "print(6 * 7)"))
    assert (done.code, done.out) == (0, "42\n")
    assert "[ok in" in done.err
    failing = await finish(
        await start(sandbox_url, "sandbox", "exec", "--lang", "bash", "-c", "echo no >&2; exit 7")
    )
    assert (failing.code, failing.out) == (7, "")
    assert failing.err.startswith("no\n") and "[nonzero_exit in" in failing.err


async def test_exec_a_file_picks_the_language_from_its_suffix(
    sandbox_url: str, tmp_path: Path
) -> None:
    script = tmp_path / "hello.sh"
    script.write_text('echo "bash $BASH_VERSION" | cut -c1-4\n')
    done = await finish(await start(sandbox_url, "sandbox", "exec", str(script)))
    assert (done.code, done.out) == (0, "bash\n")


async def test_timeouts_and_refusals_have_their_own_exit_codes(sandbox_url: str) -> None:
    slow = await finish(
        await start(sandbox_url, "sandbox", "exec", "-c", "while True: pass", "--timeout", "0.3")
    )
    assert slow.code == 124 and "[timeout in" in slow.err
    refused = await finish(
        await start(sandbox_url, "sandbox", "exec", "--lang", "cobol", "-c", "x")
    )
    assert (
        refused.code == 2
        and "unknown language 'cobol'" in refused.err
        and "$.language" in refused.err
    )
    usage = await finish(await start(sandbox_url, "sandbox", "exec"))
    assert usage.code == 2 and "either -c CODE or a FILE" in usage.err


async def test_without_a_sandbox_service_it_says_so(nats_url: str) -> None:
    done = await finish(await start(nats_url, "sandbox", "exec", "-c", "print(1)"))
    assert done.code == 1 and "no sandbox service is running" in done.err


@pytest.mark.parametrize(
    ("lang", "program", "code"),
    [
        ("c", "gcc", '#include <stdio.h>\nint main(void) { puts("hello"); return 5; }'),
        ("cpp", "g++", '#include <iostream>\nint main() { std::cout << "hello\\n"; return 5; }'),
        ("js", "node", "console.log('hello'); process.exit(5);"),
    ],
)
async def test_exec_compiled_and_script_languages(
    sandbox_url: str, lang: str, program: str, code: str
) -> None:
    if shutil.which(program) is None:  # bubblewrap runs the host's toolchains
        pytest.skip(f"no {program} on this host")
    done = await finish(await start(sandbox_url, "sandbox", "exec", "--lang", lang, "-c", code))
    assert (done.code, done.out) == (5, "hello\n"), done.err
    broken = await finish(await start(sandbox_url, "sandbox", "exec", "--lang", lang, "-c", "}"))
    assert broken.code == 1 and "[nonzero_exit in" in broken.err


async def test_exec_fetches_the_files_a_run_leaves(sandbox_url: str, tmp_path: Path) -> None:
    script = tmp_path / "make.sh"
    script.write_text("mkdir -p d && printf 'solid x\\n' > d/out.stl\n")
    done = await finish(
        await start(
            sandbox_url,
            "sandbox",
            "exec",
            str(script),
            *("--fetch", "d/out.stl", "--fetch", "no", "--fetch-dir", str(tmp_path)),
        )
    )
    assert done.code == 0, done.err
    assert (tmp_path / "out.stl").read_text() == "solid x\n"
    assert f"[d/out.stl: 8 bytes saved to {tmp_path / 'out.stl'}]" in done.err
    assert "[no: not left by the run" in done.err
