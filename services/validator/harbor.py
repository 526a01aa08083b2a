"""Harbor tasks judged by their own verifier, in a session the policy has never been in.

The state judged is the one the model left: the rollout's end snapshot of its session
on the task's image (without one, the commands are replayed as the terminal judge does,
and a replay that differs from what the model saw scores 0).  A fresh checker session
of the task's image is opened from that snapshot: only the work directory's files, no
process of the policy's, the checker user (a uid the policy never had, standing in for
Harbor's root), ``/tests`` and ``/logs`` of its own.  Only then does ``tests/`` enter a
sandbox (``solution/`` never does), and ``bash /tests/test.sh`` runs with a clean
environment: ``HOME`` outside the work directory, no user site, no startup file, and
``PYTHONSAFEPATH`` (a Python started in the work directory does not import from it).
Any reward already in ``/logs/verifier`` is removed first, and so is any symlink of the
work directory into ``/tests``, ``/logs`` or ``/solution`` (dangling where the agent
worked: followed, it would hand the answer key to the test).  What test.sh writes there is
read back in the same run and scored by ``reward_of``.

Statuses: a sandbox that fails is an InfraFailure; test.sh that runs past its limits
(time, memory) or is killed scores 0 (what it ran was the candidate's work); one that
ends without a reward, or with one that is not a number in [0, 1], makes the rollout
``invalid``, naming the task's folder and the reason.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from protocol.messages import Rollout, SandboxResult, SandboxStatus
from services.domains.harbor import REWARD_JSON, REWARD_TXT, VERIFIER_DIR, RewardError, reward_of
from services.domains.harbor_domain import HarborProblem
from services.validator.base import InvalidRollout, Verdict, reference
from services.validator.sessions import Sessions
from services.validator.terminal import NotVerified, chain, raise_infra, saved_work

#: ``tests/`` (a tar.gz on stdin) extracted where Harbor puts it.
COPY_TESTS: Final = "exec tar -xzf - --no-same-owner -C /tests"
#: Prints the reward files test.sh left (regular files, no link followed) and its exit
#: status as one JSON line; run isolated (``-I``): nothing of the work directory loads.
READER: Final = f"""
import base64, json, os, stat, sys
found = {{}}
flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
for name in ({REWARD_TXT!r}, {REWARD_JSON!r}):
    try:
        fd = os.open(os.path.join({VERIFIER_DIR!r}, name), flags)
    except OSError:
        continue
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            found[name] = base64.b64encode(os.read(fd, 65536)).decode()
    finally:
        os.close(fd)
print(json.dumps({{"exit": int(sys.argv[1]), "files": found}}))
"""
#: A link of the work directory into the verifier's folders was dangling where the
#: agent worked (they did not exist there): it is removed rather than followed into the
#: answer key.  test.sh's output goes to stderr: stdout carries only the reader's line.
VERIFY: Final = f"""mkdir -p "$HOME" {VERIFIER_DIR}
rm -f {VERIFIER_DIR}/{REWARD_TXT} {VERIFIER_DIR}/{REWARD_JSON}
find . -type l -print0 | while IFS= read -r -d '' link; do
  case "$(readlink -m -- "$link")" in
    /tests|/tests/*|/logs|/logs/*|/solution|/solution/*) rm -f -- "$link" ;;
  esac
done
bash --noprofile --norc /tests/test.sh </dev/null 1>&2
exec python3 -I -c "$1" "$?"
"""
CLEAN_ENV: Final = (
    "PATH=/usr/local/bin:/usr/bin:/bin",
    "HOME=/tmp/verifier",
    "TMPDIR=/tmp",
    "LANG=C.UTF-8",
    "PYTHONNOUSERSITE=1",
    "PYTHONSAFEPATH=1",
    "PYTHONDONTWRITEBYTECODE=1",
)
VERIFY_ARGV: Final = [
    "/usr/bin/env", "-i", *CLEAN_ENV, "/bin/bash", "--noprofile", "--norc", "-c", VERIFY,
    "verify", READER,
]  # fmt: skip
#: Statuses of a run that did not end on its own (killed at a limit, or by a signal).
CUT_OFF: Final = frozenset(
    {SandboxStatus.TIMEOUT, SandboxStatus.OOM, SandboxStatus.KILLED, SandboxStatus.OUTPUT_LIMIT}
)


@dataclass(frozen=True)
class HarborVerifier:
    sessions: Sessions
    #: The domain's tasks by problem key.
    problems: Mapping[str, HarborProblem]

    async def score(self, rollout: Rollout) -> Verdict:
        problem = self._problem(rollout)
        where = f"task {problem.task.path}"
        saved = await saved_work(
            rollout,
            lambda: self.sessions.open(
                f"replay-{rollout.id}", {}, problem.limits, image=problem.image.tag
            ),
        )
        if isinstance(saved, NotVerified):
            return Verdict(0.0, f"{where}: not verified; {saved.why}; {chain(rollout)}")
        result = await self._verify(rollout, problem, saved)
        score, said = judged(problem, result)
        return Verdict(score, f"{said}; {chain(rollout)}")

    def _problem(self, rollout: Rollout) -> HarborProblem:
        key = reference(rollout.task, "key")
        problem = self.problems.get(key) if isinstance(key, str) else None
        if problem is None:
            raise InvalidRollout(
                f"task {rollout.task.id}: key {key!r} is none of this domain's Harbor tasks "
                "(was the folder changed since the task was made?)"
            )
        return problem

    async def _verify(
        self, rollout: Rollout, problem: HarborProblem, snapshot: str
    ) -> SandboxResult:
        """test.sh's run (with the reader's line) in a checker session from the snapshot."""
        session = await self.sessions.open(
            f"verify-{rollout.id}",
            {},
            problem.verifier_limits(),
            snapshot,
            checker=True,
            image=problem.image.tag,
        )
        try:
            copied = await session.run("bash", COPY_TESTS, stdin=problem.tests)
            raise_infra(copied)
            if copied.status is SandboxStatus.NONZERO_EXIT:
                # /tests is a tmpfs of its own: tar fails on the task (too big for it).
                raise InvalidRollout(
                    f"task {problem.task.path}: tests/ could not be copied to /tests: "
                    f"{_tail(copied.stderr)}"
                )
            if copied.status is not SandboxStatus.OK:
                return copied  # killed at a limit the restored work shares: cut off, 0
            return await session.probe(VERIFY_ARGV, [])
        finally:
            await session.close()


def judged(problem: HarborProblem, result: SandboxResult) -> tuple[float, str]:
    """The score and what it says of a verifier run; InvalidRollout or InfraFailure when
    the run gives no score."""
    where = f"task {problem.task.path}"
    raise_infra(result)
    if result.status in CUT_OFF:
        return 0.0, (
            f"{where}: tests/test.sh ended {result.status} ({result.error or 'no detail'}) "
            f"before its reward was read: {_tail(result.stderr)}"
        )
    report = _report(result.stdout)
    if report is None:
        return 0.0, f"{where}: the verifier's report could not be read: {_tail(result.stderr)}"
    status, files = report
    if status > 128:
        return 0.0, f"{where}: tests/test.sh was killed by signal {status - 128}"
    try:
        reward = reward_of(files)
    except RewardError as error:
        raise InvalidRollout(f"{where}: {error} (tests/test.sh exited {status})") from None
    if reward is None:
        raise InvalidRollout(
            f"{where}: tests/test.sh wrote no reward (exited {status}): {_tail(result.stderr)}"
        )
    source = REWARD_TXT if REWARD_TXT in files else REWARD_JSON
    return reward, f"reward {reward:g} from {source} (tests/test.sh exited {status})"


def _report(stdout: str) -> tuple[int, dict[str, bytes]] | None:
    """(test.sh's exit status, the reward files) from the reader's line, or None."""
    lines = stdout.strip().splitlines()
    try:
        body: Any = json.loads(lines[-1]) if lines else None
        status, encoded = body["exit"], body["files"]
        files = {str(k): base64.b64decode(v, validate=True) for k, v in encoded.items()}
    except (ValueError, TypeError, KeyError, AttributeError, binascii.Error):
        return None
    return (status, files) if isinstance(status, int) else None


def _tail(text: str, size: int = 300) -> str:
    text = text.strip()
    return text if len(text) <= size else "..." + text[-size:]
