"""Terminal tasks: a prepared working directory, bash calls over several turns, a hidden test.

Each template draws, from the rng, the files a sandbox session starts with (a log to
analyse, a broken build, a config to fix, data to transform...), a prompt, the checks
of a hidden test, and a reference solution (shell commands).  The task carries the files
in ``metadata["sandbox_files"]`` and the checks in ``metadata["checks"]``; the prompt
never shows the checks.

How the pieces meet, and why this way:

* Generation: the generator opens each trajectory's sandbox session with the task's
  files (``SandboxOpen.files``), so the policy's first command already sees them; its
  bash calls run in that one session and are recorded on the rollout (``tool_calls``).
* Judging (``services.validator.terminal``): the generator snapshots each trajectory's
  session at its end and records the snapshot on the rollout.  The validator opens a
  fresh session from it (only the work directory's files: no process, no home outside
  it) and runs each check's probe there, one probe per fresh session, with a clean
  environment.  A probe is a command or a file read with no expected value in it; the
  observation comes back and is compared with the expected value in the validator's own
  process (``services.validator.terminal_probes``), so the answer key never enters a sandbox.  A
  rollout without a snapshot (an older generator, a hand-built one) is replayed in a
  session of its own, and each replayed output is compared with the one the model saw
  where the rollout recorded it: a replay that differs scores 0.
* Reward: the share of checks passed (1.0 when all pass); the details name each failed
  check and say why.  A workspace the policy broke scores low; only a sandbox that fails
  is ``infra_failure``.

Chain metrics (turns, commands, failed commands and recoveries) come from the rollout's
``tool_calls``, where the evaluation's chain tier reads them; the score's message repeats
them for one rollout.
"""
