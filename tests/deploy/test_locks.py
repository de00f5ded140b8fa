"""The hashed locks (constraints/*.lock.txt, written by `make lock`) against pyproject.toml, and the
running virtualenv against the dev lock.

Every dependency pyproject declares (the base, plus the extras a lock covers) has an exact, hashed pin in
that lock which satisfies pyproject's specifier; the serving lock holds no torch; the training and
serving locks hold the dev lock's versions. The environment check runs in the virtualenv `make install`
made (the repository's .venv, or RETENTION_LOCKED_VENV): there every locked distribution is installed
at the locked version."""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

from tests.deploy.conftest import REPO

CONSTRAINTS = REPO / "constraints"
DEV_LOCK = CONSTRAINTS / "dev.lock.txt"
TRAIN_LOCK = CONSTRAINTS / "train.lock.txt"
SERVE_LOCK = CONSTRAINTS / "serve.lock.txt"
# Each lock and the pyproject extras it covers (the base dependencies are in every lock).
LOCK_EXTRAS: dict[Path, tuple[str, ...]] = {
    DEV_LOCK: ("train", "dev", "ray"),
    TRAIN_LOCK: ("train",),
    SERVE_LOCK: (),
}
# The platform the locks are resolved for (Makefile LOCK_PLATFORM): markers are evaluated for it.
LOCK_PYTHON = "3.11"
LOCK_ENVIRONMENT = {
    "python_version": LOCK_PYTHON,
    "python_full_version": f"{LOCK_PYTHON}.0",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
}
HASH = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class Pin:
    name: NormalizedName
    version: Version
    hashes: tuple[str, ...]


class LockError(ValueError):
    pass


def entries(text: str) -> list[str]:
    """The logical lines of a requirements file: backslash continuations joined, comments dropped."""
    logical: list[str] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        current = f"{current} {line}".strip()
        if current.endswith("\\"):
            current = current[:-1].strip()
            continue
        logical.append(current)
        current = ""
    if current:
        logical.append(current)
    return logical


def read_lock(path: Path) -> dict[NormalizedName, Pin]:
    """Every entry of a lock, which must be `name==version --hash=sha256:...` (at least one hash): no
    options (-e, --index-url), no ranges, no duplicates."""
    pins: dict[NormalizedName, Pin] = {}
    for entry in entries(path.read_text()):
        spec, *hashes = re.split(r"\s+--hash=", entry)
        if spec.startswith("-"):
            raise LockError(f"{path.name}: an option, not a pinned requirement: {entry!r}")
        try:
            requirement = Requirement(spec)
        except InvalidRequirement as error:
            raise LockError(f"{path.name}: {spec!r}: {error}") from error
        specifiers = list(requirement.specifier)
        if len(specifiers) != 1 or specifiers[0].operator != "==" or "*" in specifiers[0].version:
            raise LockError(f"{path.name}: {spec!r} is not pinned with == to one version")
        if not hashes or not all(HASH.fullmatch(value) for value in hashes):
            raise LockError(f"{path.name}: {spec!r} has no sha256 hash (or a malformed one)")
        name = canonicalize_name(requirement.name)
        if name in pins:
            raise LockError(f"{path.name}: {name} is pinned twice")
        pins[name] = Pin(name, Version(specifiers[0].version), tuple(hashes))
    if not pins:
        raise LockError(f"{path.name}: no pinned entries")
    return pins


def declared(extras: tuple[str, ...]) -> list[Requirement]:
    """pyproject's base dependencies and those of `extras` that apply on the lock's platform."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    groups = [("", project["dependencies"])]
    groups += [(extra, project["optional-dependencies"][extra]) for extra in extras]
    requirements = []
    for extra, specs in groups:
        environment = {**LOCK_ENVIRONMENT, "extra": extra}
        for spec in specs:
            requirement = Requirement(spec)
            if requirement.marker is None or requirement.marker.evaluate(environment):
                requirements.append(requirement)
    return requirements


def unmet(requirements: list[Requirement], pins: dict[NormalizedName, Pin]) -> list[str]:
    """The requirements the pins do not satisfy (missing, or a version outside the specifier)."""
    problems = []
    for requirement in requirements:
        pin = pins.get(canonicalize_name(requirement.name))
        if pin is None:
            problems.append(f"{requirement} is not in the lock")
        elif not requirement.specifier.contains(pin.version, prereleases=True):
            problems.append(f"{requirement}: the lock pins {pin.version}")
    return problems


def cpu_constraints() -> list[Requirement]:
    return [Requirement(line) for line in entries((CONSTRAINTS / "cpu.txt").read_text())]


@pytest.mark.parametrize("lock", list(LOCK_EXTRAS), ids=lambda path: path.name)
def test_every_lock_entry_is_pinned_and_hashed(lock: Path) -> None:
    pins = read_lock(lock)  # raises on an unpinned or unhashed entry
    assert all(pin.hashes for pin in pins.values())


@pytest.mark.parametrize("lock", list(LOCK_EXTRAS), ids=lambda path: path.name)
def test_lock_satisfies_pyproject(lock: Path) -> None:
    """A dependency added to pyproject, or a specifier moved past the locked version, fails here until
    `make lock` runs."""
    extras = LOCK_EXTRAS[lock]
    requirements = declared(extras)
    if "train" in extras:
        requirements += cpu_constraints()  # torch as constraints/cpu.txt pins it
    assert not unmet(requirements, read_lock(lock)), "run make lock"


@pytest.mark.parametrize("lock", list(LOCK_EXTRAS), ids=lambda path: path.name)
def test_lock_names_its_platform(lock: Path) -> None:
    header = "\n".join(lock.read_text().splitlines()[:5])
    assert f"CPython {LOCK_PYTHON}, Linux x86_64" in header and "make lock" in header
    requires_python = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert SpecifierSet(requires_python).contains(LOCK_PYTHON)
    assert f"--python-version {LOCK_PYTHON} " in (REPO / "Makefile").read_text()


def test_serving_lock_has_no_torch() -> None:
    names = set(read_lock(SERVE_LOCK))
    assert not names & {"torch", "torchvision", "torchaudio", "triton"}
    assert not {name for name in names if name.startswith("nvidia-")}


def test_training_locks_pin_the_cpu_torch_build() -> None:
    """PyPI's Linux x86_64 torch is the CUDA build; the locks take the +cpu wheel (no nvidia-* wheels)."""
    for lock in (DEV_LOCK, TRAIN_LOCK):
        pins = read_lock(lock)
        assert pins[canonicalize_name("torch")].version.local == "cpu", lock.name
        assert not {name for name in pins if name.startswith("nvidia-")}, lock.name


@pytest.mark.parametrize("lock", [TRAIN_LOCK, SERVE_LOCK], ids=lambda path: path.name)
def test_image_locks_hold_the_dev_lock_versions(lock: Path) -> None:
    """The images run the versions the test suite ran against."""
    dev = read_lock(DEV_LOCK)
    differ = {
        name: (str(pin.version), str(dev[name].version) if name in dev else None)
        for name, pin in read_lock(lock).items()
        if name not in dev or dev[name].version != pin.version
    }
    assert not differ, f"{lock.name} vs {DEV_LOCK.name}: {differ}; run make lock"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("numpy==2.0.0\n", "no sha256 hash"),
        (f"numpy>=2.0 --hash=sha256:{'0' * 64}\n", "not pinned"),
        (f"-e .\nnumpy==2.0.0 --hash=sha256:{'0' * 64}\n", "an option"),
        (f"numpy==2.0.0 \\\n    --hash=sha256:{'0' * 64}\nNumPy==2.0.0 --hash=sha256:{'1' * 64}\n", "twice"),
        ("# only comments\n", "no pinned entries"),
    ],
)
def test_read_lock_rejects_a_bad_lock(tmp_path: Path, text: str, problem: str) -> None:
    bad = tmp_path / "bad.lock.txt"
    bad.write_text(text)
    with pytest.raises(LockError, match=problem):
        read_lock(bad)


def test_unmet_catches_a_missing_or_out_of_range_pin() -> None:
    pins = {canonicalize_name("numpy"): Pin(canonicalize_name("numpy"), Version("1.25.0"), ("sha256:0",))}
    assert unmet([Requirement("numpy>=1.26")], pins) == ["numpy>=1.26: the lock pins 1.25.0"]
    assert unmet([Requirement("fastapi")], pins) == ["fastapi is not in the lock"]
    assert not unmet([Requirement("numpy>=1.20")], pins)


def locked_venv() -> Path:
    return Path(os.environ.get("RETENTION_LOCKED_VENV") or REPO / ".venv")


@pytest.mark.skipif(
    Path(sys.prefix).resolve() != locked_venv().resolve(),
    reason=f"not the virtualenv make install made ({locked_venv()}; RETENTION_LOCKED_VENV names another)",
)
def test_installed_environment_is_the_dev_lock() -> None:
    """Every distribution of the dev lock is installed at its locked version (packages outside the lock,
    such as podman-compose from make image-test, are not checked)."""
    wrong = {}
    for name, pin in read_lock(DEV_LOCK).items():
        try:
            installed: Version | None = Version(importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            installed = None
        if installed != pin.version:
            wrong[name] = (str(pin.version), str(installed) if installed else "not installed")
    assert not wrong, f"(locked, installed) differ: {wrong}; run make install"
