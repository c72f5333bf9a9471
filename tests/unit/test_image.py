"""The container image's own files are enough for `kron` to start.

No Docker engine runs on the development machines, so this builds the image's contents the
way the `Dockerfile` does, without Docker: it reads the Dockerfile's `WORKDIR`, `COPY` and
`RUN pip install` lines (so a change there is followed here), copies exactly those files
into an empty directory, installs that directory into a fresh `python -m venv` with
`pip install`, and runs the `kron` entry point from there, in an empty working directory and
without PYTHONPATH: `kron --help`, `kron worker --help`, `kron api --help`, and every
`kron ...` command of docker-compose.yml with `--help` appended (an option kron does not know
fails there as it would in the container).

One shortcut, for speed and to need no network beyond the build backend (setuptools and wheel,
fetched as the image's `pip install .` fetches them): kron itself is built and installed
with `--no-deps`, and the third-party dependencies come from the running venv's
site-packages, made visible through a `.pth` file (a path entry, so that venv's editable
install of the whole repository stays inert). `pip check` then confirms they satisfy
kron's requirements, and the test asserts that `kron` is imported from the fresh venv and
that `bench` and `tests` (which the image does not copy) are not importable. What it does not
prove: that the base image's Python (python:3.11-slim) or PyPI's newest matching versions
behave like this venv's.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path, PurePosixPath

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")


def dockerfile_lines() -> list[tuple[str, str]]:
    """(instruction, arguments) per Dockerfile line, comments and blanks dropped."""
    out = []
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def copy_like_dockerfile(dest_root: Path) -> Path:
    """Copy what the Dockerfile's COPY lines copy, WORKDIR mapped to dest_root; returns the
    directory its `RUN pip install` installs (the Python packages copied are its subdirectories
    with an __init__.py)."""
    workdir = PurePosixPath("/")
    installs = []
    for word, args in dockerfile_lines():
        if word == "WORKDIR":
            workdir = workdir / args
        elif word in ("COPY", "ADD"):
            parts = [p for p in shlex.split(args) if not p.startswith("--")]
            assert word == "COPY" and not args.startswith("["), f"teach this test: {word} {args}"
            *sources, target = parts
            dest = dest_root / (workdir / target).relative_to(workdir)
            into_dir = target.endswith("/") or len(sources) > 1
            for src in sources:
                path = ROOT / src
                assert path.exists(), f"the Dockerfile copies {src}, which does not exist"
                if path.is_dir():  # Docker copies a directory's contents into the target
                    shutil.copytree(path, dest, ignore=IGNORE, dirs_exist_ok=True)
                elif into_dir:
                    dest.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, dest / path.name)
                else:
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, dest)
        elif word == "RUN" and "pip install" in args:
            installs.append(shlex.split(args)[-1])
    assert installs, "the Dockerfile installs nothing with pip"
    return dest_root / installs[-1]


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    assert not (ROOT / ".dockerignore").exists(), "teach this test the .dockerignore"
    base = tmp_path_factory.mktemp("image")
    app = copy_like_dockerfile(base / "app")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    vpy = venv / "bin" / "python"
    site = subprocess.run(
        [str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip()
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site) / "zz_kron_test_deps.pth").write_text("".join(f"{d}\n" for d in sorted(deps)))
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    subprocess.run([str(vpy), "-m", "pip", "install", "-q", "--no-deps", str(app)],
                   check=True, env=env, cwd=base)
    packages = sorted(p.parent.name for p in app.glob("*/__init__.py"))
    shutil.rmtree(app)  # what runs must be what pip installed, not the copied tree
    cwd = base / "empty"
    cwd.mkdir()
    return {"venv": venv, "env": env, "cwd": cwd, "packages": packages}


def run(image: dict[str, object], *argv: str) -> subprocess.CompletedProcess[str]:
    venv = image["venv"]
    assert isinstance(venv, Path)
    exe = venv / "bin" / argv[0]
    return subprocess.run([str(exe), *argv[1:]], capture_output=True, text=True, timeout=120,
                          env=image["env"], cwd=image["cwd"])  # type: ignore[arg-type]


def test_installed_from_the_image_files_alone(image: dict[str, object]) -> None:
    probe = run(image, "python", "-c", (
        "import importlib.util as u, kron, sys\n"
        "print(kron.__file__)\n"
        "print(u.find_spec('bench'), u.find_spec('tests'))\n"))
    assert probe.returncode == 0, probe.stderr
    origin, missing = probe.stdout.splitlines()
    assert origin.startswith(str(image["venv"])), origin
    assert missing == "None None", "the image copies neither bench/ nor tests/"
    check = run(image, "python", "-m", "pip", "check")
    assert check.returncode == 0, check.stdout + check.stderr


def test_every_module_of_the_image_imports(image: dict[str, object]) -> None:
    """A module-level import of bench/ or tests/ anywhere (not only in the CLI) would break a
    container at run time; `__main__` modules run their program, so they are left out."""
    packages = image["packages"]
    assert isinstance(packages, list) and {"kron", "streams", "api"} <= set(packages)
    done = run(image, "python", "-c", (
        "import importlib, pkgutil, sys\n"
        "bad = []\n"
        f"for top in {packages!r}:\n"
        "    pkg = importlib.import_module(top)\n"
        "    for info in pkgutil.walk_packages(pkg.__path__, top + '.'):\n"
        "        if info.name.rpartition('.')[2] == '__main__':\n"
        "            continue\n"
        "        try:\n"
        "            importlib.import_module(info.name)\n"
        "        except Exception as exc:\n"
        "            bad.append(f'{info.name}: {exc!r}')\n"
        "print('\\n'.join(bad))\n"
        "sys.exit(1 if bad else 0)\n"))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("argv, names", [
    ([], "worker"),
    (["worker"], "kron worker"),
    (["api"], "kron api"),
])
def test_kron_help_starts(image: dict[str, object], argv: list[str], names: str) -> None:
    done = run(image, "kron", *argv, "--help")
    assert done.returncode == 0, done.stderr
    assert "Usage: kron" in done.stdout and names in done.stdout, done.stdout


def test_compose_commands_parse_in_the_image(image: dict[str, object]) -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    commands = [s["command"] for s in services.values()
                if s.get("build") and s.get("command")]
    assert len(commands) >= 4
    for cmd in commands:
        assert cmd[0] == "kron", cmd
        done = run(image, *cmd, "--help")
        assert done.returncode == 0, (cmd, done.stdout, done.stderr)
        assert f"Usage: kron {cmd[1]}" in done.stdout, (cmd, done.stdout)


def test_bench_says_it_is_not_in_the_image(image: dict[str, object]) -> None:
    for argv in (["bench"], ["bench", "steady", "--rate", "5"], ["bench", "--help"]):
        done = run(image, "kron", *argv)
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        assert "not part of this installation" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
