"""Makes `.envpool/`: envpool for Atari alone, small enough to travel with a command to the GPU machine.

    python benchmarks/envpool_kit.py [--python-version 3.12] [--folder .envpool]

LeanRL's Atari figure steps its 8 Breakout envs with envpool; this project's Atari preset steps ale-py's
threaded vector env. To compare the two backends on the same card, envpool must reach a machine that has
no package index, and its wheel (every env family's library) and its assets wheel (every family's data)
come to 115 MB, past the 64 MiB a device call may carry. Atari needs only its own library and ROMs.

The folder holds, for one Python version (the GPU machine's is 3.12), the versions constraints.txt pins:
envpool with every other family's library taken out and its entry point registering Atari alone, the
Atari part of envpool's assets, and the packages envpool's Python code imports that the GPU machine
lacks. `benchmarks/gpu_check.sh` puts it on PYTHONPATH. When the version is this Python's own,
the script then makes a Breakout pool from the folder, as a check.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
# envpool's package, its assets, and what its Python code imports beyond numpy and gymnasium (which the GPU
# machine has, or .whl/ brings).
PACKAGES = ("envpool", "envpool-assets", "dm-env", "absl-py", "optree")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def pinned(name: str) -> str:
    """`NAME==VERSION` as constraints.txt pins it."""
    for line in (REPOSITORY / "constraints.txt").read_text().splitlines():
        requirement = line.split("#")[0].split(";")[0].strip()
        if re.fullmatch(rf"{re.escape(name)}==\S+", requirement, flags=re.IGNORECASE):
            return requirement
    raise SystemExit(f"envpool_kit.py: constraints.txt pins no version of {name}")


def download(python_version: str, folder: Path) -> list[Path]:
    """The pinned wheels for `python_version` on x86-64 Linux, without their dependencies."""
    platforms = [option for platform in PLATFORMS for option in ("--platform", platform)]
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", python_version, "--implementation", "cp", *platforms, "-d", str(folder)]
    subprocess.run([*command, *(pinned(name) for name in PACKAGES)], check=True)
    return sorted(folder.glob("*.whl"))


def kept(member: str) -> bool:
    """Whether a wheel's file is needed to make Atari envs: of another env family, only its Python code."""
    package, *inner = member.split("/")
    family = inner[0] if len(inner) > 1 else None  # a file in a folder of the package
    if package == "envpool" and family not in (None, "atari", "python"):
        return member.endswith(".py")
    if package == "envpool_assets" and family is not None:
        return family == "atari"
    return True


def unpack(wheel: Path, folder: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if kept(member):
                archive.extract(member, folder)


def register_atari_alone(folder: Path) -> None:
    """envpool's entry point imports each family's registration, whose package loads the family's library."""
    entry = folder / "envpool" / "entry.py"
    lines = entry.read_text().splitlines(keepends=True)
    families = [line for line in lines if line.startswith("import envpool.")]
    if "import envpool.atari.registration  # noqa: F401\n" not in families:
        raise SystemExit(f"envpool_kit.py: {entry} no longer imports envpool.atari.registration as expected")
    entry.write_text("".join(line for line in lines if line not in families or ".atari." in line))


def check(folder: Path) -> None:
    """Make and step a Breakout pool with the folder's envpool, first on the path."""
    code = (
        f"import envpool, numpy; assert envpool.__file__.startswith({str(folder)!r}), envpool.__file__; "
        "pool = envpool.make('Breakout-v5', env_type='gymnasium', num_envs=2); pool.reset(); "
        "pool.step(numpy.zeros(2, dtype=numpy.int64)); print('made and stepped Breakout-v5 from', envpool.__file__)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": str(folder)})


def size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python")
    parser.add_argument("--folder", type=Path, default=REPOSITORY / ".envpool")
    args = parser.parse_args()
    folder = args.folder.resolve()
    shutil.rmtree(folder, ignore_errors=True)
    with tempfile.TemporaryDirectory() as downloads:
        for wheel in download(args.python_version, Path(downloads)):
            unpack(wheel, folder)
    register_atari_alone(folder)
    print(f"{folder}: {size(folder) / 2**20:.1f} MiB")
    if args.python_version == f"{sys.version_info.major}.{sys.version_info.minor}":
        check(folder)


if __name__ == "__main__":
    main()
