"""``temper sandbox exec``: run code in the sandbox service and print what it did."""

from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path
from typing import Any

from protocol.messages import SandboxExec, SandboxLimits, SandboxResult, SandboxStatus
from services.cli.common import CliError, connect, emit_json, run
from services.runtime.ask import AskTimeout, BadReply, NoResponder, Refused
from services.sandbox.client import SandboxClient

_BY_SUFFIX = {
    ".py": "python",
    ".sh": "bash",
    ".bash": "bash",
    ".c": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".cxx": "cpp",
    ".js": "js",
    ".scad": "openscad",
}


def register(commands: Any) -> None:
    sandbox = commands.add_parser("sandbox", help="run code in the sandbox service")
    actions = sandbox.add_subparsers(dest="action", required=True, metavar="ACTION")
    execute = actions.add_parser("exec", help="run code (-c) or a file; exit with its exit code")
    execute.add_argument(
        "file", nargs="?", type=Path, help="source file (language from its suffix)"
    )
    execute.add_argument("-c", "--code", help="source code to run")
    execute.add_argument(
        "--lang",
        help="python, bash, sh, c, cpp, js, openscad (default: by file suffix, else python)",
    )
    execute.add_argument("--stdin", type=Path, help="file to feed on standard input")
    execute.add_argument("--timeout", type=float, help="seconds (default: the service's)")
    execute.add_argument("--memory-mb", type=int, help="memory limit (default: the language's)")
    execute.add_argument("--pids", type=int, help="process limit (default: the language's)")
    execute.add_argument(
        "--fetch",
        action="append",
        default=[],
        metavar="PATH",
        help="a work-directory file to bring back once the run is over (e.g. out.stl of an"
        " openscad run), saved under its own name in --fetch-dir; repeatable",
    )
    execute.add_argument(
        "--fetch-dir", type=Path, default=Path("."), help="where fetched files go (default: .)"
    )
    execute.add_argument("--json", action="store_true", help="print the SandboxResult as JSON")
    execute.set_defaults(run=cmd_exec)


def build_request(args: argparse.Namespace) -> SandboxExec:
    if (args.code is None) == (args.file is None):
        raise CliError("give either -c CODE or a FILE", 2)
    if args.file is not None and not args.file.is_file():
        raise CliError(f"{args.file}: no such file", 2)
    code = args.code if args.code is not None else args.file.read_text()
    language = args.lang or (_BY_SUFFIX.get(args.file.suffix, "python") if args.file else "python")
    stdin = args.stdin.read_bytes() if args.stdin else b""
    limits = SandboxLimits(timeout_s=args.timeout, memory_mb=args.memory_mb, pids=args.pids)
    return SandboxExec(
        id=uuid.uuid4().hex,
        language=language,
        code=code,
        stdin=stdin,
        limits=limits,
        outputs=list(args.fetch),
    )


def cmd_exec(args: argparse.Namespace) -> int:
    request = build_request(args)
    return run(lambda: _exec(args.nats_url, request, args.json, args.fetch_dir))


async def _exec(url: str, request: SandboxExec, as_json: bool, fetch_dir: Path) -> int:
    nc = await connect(url, "temper-sandbox")
    wait = (request.limits.timeout_s or 120.0) + 30.0
    try:
        result = await SandboxClient(nc).exec(request, wait)
    except NoResponder:
        raise CliError("no sandbox service is running (temper up starts one)") from None
    except (AskTimeout, BadReply) as error:
        raise CliError(f"no usable answer from the sandbox service: {error}") from None
    except Refused as error:
        field = f" (at {error.field})" if error.field else ""
        raise CliError(f"refused: {error.message}{field}", 2) from None
    finally:
        await nc.close()
    _save_outputs(result, request.outputs, fetch_dir)
    return _show(result, as_json)


def _save_outputs(result: SandboxResult, wanted: list[str], into: Path) -> None:
    """Each fetched file into ``into`` under its own name."""
    for path in wanted:
        data = result.outputs.get(path)
        if data is None:
            print(f"[{path}: not left by the run, or over the output limit]", file=sys.stderr)
            continue
        target = into / Path(path).name
        target.write_bytes(data)
        print(f"[{path}: {len(data)} bytes saved to {target}]", file=sys.stderr)


def _show(result: SandboxResult, as_json: bool) -> int:
    if as_json:
        emit_json(result)
    else:
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        truncated = (
            " (output truncated)" if result.stdout_truncated or result.stderr_truncated else ""
        )
        detail = f": {result.error}" if result.error else ""
        print(
            f"[{result.status.value} in {result.duration_s * 1000:.1f} ms{truncated}{detail}]",
            file=sys.stderr,
        )
    if result.status in (SandboxStatus.OK, SandboxStatus.NONZERO_EXIT):
        return result.exit_code or 0
    return 124 if result.status is SandboxStatus.TIMEOUT else 125
