"""deploy/gpu/check.sh: its CPU fallback in the quickest mode measures every section, and
its install step installs the project from a wheel folder alone, with no index.

The measured figures are printed, never judged here: a section counts when it printed its
figures (and, measuring one thing against another, the ratio); one that failed fails."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from tests.benches import load_bench

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "deploy" / "gpu" / "check.sh"
MEASURED = {
    "generator": ("tok/s", "higher"),
    "learner": ("ms", "lower"),
    "publication": ("ms", "lower"),
}
RATIO = re.compile(
    r"^RESULT (?P<section>\w+): ours (?P<ours>[\d.]+) (?P<unit>\S+), baseline (?P<base>[\d.]+) "
    r"(?P=unit), ratio ours/baseline (?P<ratio>[\d.]+) \((?P<better>\w+) is better, "
    r"(?P<rounds>\d+) rounds\)$",
    re.MULTILINE,
)
TRAIN = re.compile(
    r"^RESULT train: (?P<steps>\d+) steps in \d+ s, reward first [\d.]+ -> last [\d.]+, "
    r"held-out greedy [\d.]+% \(v0\) -> [\d.]+% \(v(?P<version>\d+)\), sampled [\d.]+% -> [\d.]+%$",
    re.MULTILINE,
)
REWARDS = re.compile(r"^  reward per step \((\d+) steps\): ((?:[\d.]+ ?)+)$", re.MULTILINE)


def check(
    *args: str, python: str = sys.executable, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TEMPER_PYTHON": python}
    return subprocess.run(
        ["bash", str(CHECK), *args], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.mark.timeout(600)
def test_quick_cpu_fallback_prints_every_section_with_its_ratio(tmp_path: Path) -> None:
    out_dir = tmp_path / "check"
    done = check("--no-install", "--quick", "--device", "cpu", "--out", str(out_dir), timeout=560)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "FAILED" not in out and "Traceback" not in out, out
    assert "profile quick: cpu, float32" in out
    ratios = {m["section"]: m for m in RATIO.finditer(out)}
    assert set(ratios) == set(MEASURED), out
    for section, (unit, better) in MEASURED.items():
        found = ratios[section]
        ours, base, ratio = float(found["ours"]), float(found["base"]), float(found["ratio"])
        assert (found["unit"], found["better"]) == (unit, better)
        assert ours > 0 and base > 0 and int(found["rounds"]) >= 1
        # The ratio is the medians' (printed to 0.1, or 3 figures below 10).
        assert ratio == pytest.approx(ours / base, rel=0.02, abs=0.01), found.group(0)
    train = TRAIN.search(out)
    assert train is not None, out
    assert int(train["steps"]) >= 2 and int(train["version"]) >= 2
    rewards = REWARDS.search(out)
    assert rewards is not None and int(rewards[1]) == len(rewards[2].split()), out
    for each in ("generator", "learner", "publication", "train"):
        assert re.search(rf"^{each}\s", out.split("== summary")[1], re.MULTILINE), out
    # What temper train writes is kept under --out.
    assert (out_dir / "train" / "train.png").read_bytes()[:4] == b"\x89PNG"
    metrics = (out_dir / "train" / "learner" / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == int(train["steps"])


@pytest.mark.timeout(300)
def test_install_from_an_empty_wheel_folder_when_every_dependency_is_there(
    tmp_path: Path,
) -> None:
    """A venv that sees torch, transformers and the rest (this one's packages, through a
    .pth file) but not the project: the install step installs the project with no index
    and no wheel, editable from its own folder, then hands over to the check."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, repo / name)
    for folder in ("protocol", "services", "bench", "deploy/gpu"):
        shutil.copytree(
            ROOT / folder, repo / folder, ignore=shutil.ignore_patterns("__pycache__", "wheels")
        )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    python = str(venv / "bin" / "python")
    env = {**os.environ, "TEMPER_PYTHON": python}
    done = subprocess.run(
        ["bash", str(repo / "deploy/gpu/check.sh"), "--wheels", str(wheels), "--sections", "none"],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    # Installed; then the check refuses the unknown section (status 2) by its own message.
    assert "Successfully installed temper" in done.stdout, done.stdout + done.stderr
    assert done.returncode == 2 and "--sections: unknown ['none']" in done.stderr
    where = subprocess.run(
        [python, "-c", "import services; print(services.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,  # not the checkout: ``-c`` puts the working directory first
    )
    assert where.stdout.strip() == str(repo / "services" / "__init__.py")


def test_bad_usage_is_named() -> None:
    missing = check("--wheels", "/nonexistent/wheels")
    assert missing.returncode == 2
    assert "wheel folder /nonexistent/wheels does not exist" in missing.stderr
    assert "--fetch-wheels" in missing.stderr
    assert check("--limit", "soon").returncode == 2
    hidden = check("--no-install", "--hidden", "100")
    assert hidden.returncode == 2 and "--hidden must be a multiple of 64" in hidden.stderr


def test_rounds_stop_inside_their_box_and_stop_tokens_end_a_row() -> None:
    common = load_bench("gpu_check_common")
    calls: list[int] = []

    def slow(round_: int) -> float:
        calls.append(round_)
        time.sleep(0.05)
        return 1.0

    ours, base = common.alternate(slow, slow, seconds=0.3)
    # Round 0 of each is untimed; about 0.1 s a round fits three in 0.3 s.
    assert calls[:2] == [0, 0] and 1 <= len(ours) <= 3 and len(ours) == len(base)
    sections = load_bench("gpu_check_sections")
    assert sections._until_stop([5, 7, 2, 0, 0], {2}) == 3
    assert sections._until_stop([5, 7, 9], {2}) == 3
