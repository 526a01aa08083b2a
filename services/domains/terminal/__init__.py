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
* Judging (``services.validator.terminal``): the validator opens a fresh session with
  the same files, replays the rollout's bash calls in order, then runs the hidden test
  as one last exec of that session and reads one line per check.  Replaying was chosen
  over snapshotting the generator's session: it needs no change to the rollout message
  and no snapshot kept alive between two services, the validator never depends on a
  session the generator may already have lost, and the policy's commands cannot see
  the test (it exists only in the last exec).  The cost: commands run twice, and a
  command whose effect is not reproducible (time, randomness) may judge differently.
  The templates check files, not such effects.
* Reward: the share of checks passed (1.0 when all pass); the details name each failed
  check and say why.  A sandbox that fails is ``infra_failure``, never a reward of 0.

Chain metrics (turns, commands, failed commands and recoveries) come from the rollout's
``tool_calls``, where the evaluation's chain tier reads them; the score's message repeats
them for one rollout.
"""
