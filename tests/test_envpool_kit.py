"""benchmarks/envpool_kit.py: envpool cut down to Atari, to carry to a GPU machine."""

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import envpool_kit

INSTALLED_ENVPOOL = importlib.util.find_spec("envpool")


def a_wheel(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


@pytest.mark.skipif(INSTALLED_ENVPOOL is None, reason="reads the installed envpool's entry point")
def test_the_kit_keeps_atari_and_the_other_families_python_alone_and_registers_atari_alone(tmp_path):
    entry = (Path(INSTALLED_ENVPOOL.origin).parent / "entry.py").read_text()  # the real one: its shape is checked
    envpool = a_wheel(
        tmp_path / "envpool.whl",
        {
            "envpool/__init__.py": "",
            "envpool/entry.py": entry,
            "envpool/python/api.py": "",
            "envpool/atari/atari_envpool.so": "atari",
            "envpool/atari/registration.py": "",
            "envpool/mujoco/mujoco_gym_envpool.so": "mujoco",
            "envpool/mujoco/gym/registration.py": "",
            "envpool/vizdoom/bin/vizdoom": "vizdoom",
            "envpool-1.2.5.dist-info/METADATA": "",
        },
    )
    assets = a_wheel(
        tmp_path / "assets.whl",
        {
            "envpool_assets/__init__.py": "",
            "envpool_assets/atari/roms/breakout.bin": "rom",
            "envpool_assets/mujoco/half_cheetah.xml": "model",
        },
    )
    folder = tmp_path / "kit"
    for wheel in (envpool, assets):
        envpool_kit.unpack(wheel, folder)
    envpool_kit.register_atari_alone(folder)
    kept = {str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file()}
    assert kept == {
        "envpool/__init__.py",
        "envpool/entry.py",
        "envpool/python/api.py",
        "envpool/atari/atari_envpool.so",
        "envpool/atari/registration.py",
        "envpool/mujoco/gym/registration.py",
        "envpool-1.2.5.dist-info/METADATA",
        "envpool_assets/__init__.py",
        "envpool_assets/atari/roms/breakout.bin",
    }
    imports = [line for line in (folder / "envpool/entry.py").read_text().splitlines() if line.startswith("import")]
    assert imports == ["import envpool.atari.registration  # noqa: F401"]


def test_an_entry_point_of_another_shape_is_refused_rather_than_cut_blind(tmp_path):
    (tmp_path / "envpool").mkdir()
    (tmp_path / "envpool" / "entry.py").write_text("from envpool.atari import registration\n")
    with pytest.raises(SystemExit, match=r"no longer imports envpool\.atari\.registration"):
        envpool_kit.register_atari_alone(tmp_path)


def test_the_kit_takes_the_versions_constraints_pins():
    pinned = [envpool_kit.pinned(name) for name in envpool_kit.PACKAGES]
    assert pinned[0].startswith("envpool==") and pinned[1].startswith("envpool-assets==")
    with pytest.raises(SystemExit, match="pins no version of no-such-package"):
        envpool_kit.pinned("no-such-package")


@pytest.mark.slow
@pytest.mark.skipif(INSTALLED_ENVPOOL is None, reason="downloads the envpool this Python installed")
def test_the_kit_for_this_python_makes_and_steps_breakout(tmp_path):
    folder = tmp_path / "envpool"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    script = Path(envpool_kit.__file__)
    made = subprocess.run(
        [sys.executable, str(script), "--python-version", version, "--folder", str(folder)],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    assert "made and stepped Breakout-v5 from " + str(folder) in made.stdout
    assert envpool_kit.size(folder) < 20 * 2**20
