"""bench/accelerator/: the wheels carried to the lent H200 machine (issue 40), without the network.

The carried list (wheels.txt) covers requirements.txt minus the image's packages (image_packages.txt);
fetch_wheels.sh downloads exactly that list with the device README's pip line (run here with a stand-in
pip that makes wheels) and refuses a folder with another wheel in it; check_wheels finds a second version,
an unmet or mismatched requirement and a resolution that needs something nobody brings."""

import os
import pathlib
import stat
import subprocess
import sys
import zipfile

import pytest

from bench.accelerator import check_wheels as cw
from tests.fakes import REPO

ACCELERATOR = REPO / "bench" / "accelerator"


def make_wheel(directory: pathlib.Path, name: str, version: str, requires=(), requires_python: str | None = None,
               tag: str = "py3-none-any") -> pathlib.Path:
    """A minimal installable wheel: only its .dist-info (METADATA, WHEEL, RECORD)."""
    dist = f"{name.replace('-', '_')}-{version}"
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Python: {requires_python}"] if requires_python else []
    lines += [f"Requires-Dist: {r}" for r in requires]
    files = {f"{dist}.dist-info/METADATA": "\n".join(lines) + "\n",
             f"{dist}.dist-info/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n"}
    files[f"{dist}.dist-info/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{dist}.dist-info/RECORD"])
    path = directory / f"{dist}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, text in files.items():
            zf.writestr(member, text)
    return path


# ----------------------------------------------------------------------------------------------
# The lists.
# ----------------------------------------------------------------------------------------------


def test_the_carried_wheels_cover_requirements_minus_the_image():
    required = cw.read_pins(REPO / "requirements.txt")
    image = cw.read_pins(ACCELERATOR / "image_packages.txt")
    carried = cw.read_pins(ACCELERATOR / "wheels.txt")
    missing = required.keys() - image.keys()
    assert missing == {"datasets", "ml-collections", "tensorboardx"}  # as read on 2026-11-17 (KINDS.md)
    assert missing <= carried.keys(), f"not carried: {sorted(missing - carried.keys())}"
    # Only what the image lacks ("carry one only for another version"), one pinned version of each...
    assert not carried.keys() & image.keys(), sorted(carried.keys() & image.keys())
    assert all(version for version in carried.values())
    # ... and the version the suite tests here, for those requirements.txt pins.
    assert {n: carried[n] for n in missing} == {n: required[n] for n in missing}


def test_the_image_list_is_kinds_md_with_its_known_versions():
    """KINDS.md's versions, and those the device check read there on 2026-12-04 (flax, orbax and the
    packages the carried wheels need, unverified before); a name nobody has read keeps no version."""
    image = cw.read_pins(ACCELERATOR / "image_packages.txt")
    assert len(image) > 150 and image["jax"] == "0.11.2" and image["transformers"] == "5.17.0"
    assert image["numpy"] == "2.5.2" and image["huggingface-hub"] == "1.33.0" and image["flax"] == "0.12.10"
    assert image["orbax-checkpoint"] == "0.12.4" and image["pandas"] is None


def test_read_pins_normalizes_names_and_skips_comments_and_options(tmp_path):
    path = tmp_path / "r.txt"
    path.write_text("-r other.txt\n# a comment\ntensorboardX==2.6.5  # why\nml_collections\n\nscipy>=1\n")
    assert cw.read_pins(path) == {"tensorboardx": "2.6.5", "ml-collections": None, "scipy": None}
    path.write_text("datasets==1\nDatasets==2\n")
    with pytest.raises(ValueError, match="twice"):
        cw.read_pins(path)


# ----------------------------------------------------------------------------------------------
# fetch_wheels.sh, with a stand-in pip.
# ----------------------------------------------------------------------------------------------

FAKE_PYTHON = """#!/usr/bin/env bash
# `python -m pip download ... -d DIR NAME==VERSION...`: record the arguments, make empty wheels; else python.
if [[ "$1 $2 $3" == "-m pip download" ]]; then
  echo "$@" >> "$PIP_LOG"
  exec {python} {fake_pip} "$@"
fi
exec {python} "$@"
"""

FAKE_PIP = """import pathlib, sys, zipfile
args = sys.argv[1:]
out = pathlib.Path(args[args.index("-d") + 1])
out.mkdir(parents=True, exist_ok=True)
for pin in (a for a in args if "==" in a):
    name, version = pin.split("==")
    dist = name.replace("-", "_") + "-" + version
    with zipfile.ZipFile(out / (dist + "-py3-none-any.whl"), "w") as zf:
        zf.writestr(dist + ".dist-info/METADATA", "Metadata-Version: 2.1\\nName: %s\\nVersion: %s\\n" % (name, version))
"""


@pytest.fixture
def fake_python(tmp_path):
    (tmp_path / "fake_pip.py").write_text(FAKE_PIP)
    path = tmp_path / "python"
    path.write_text(FAKE_PYTHON.format(python=sys.executable, fake_pip=tmp_path / "fake_pip.py"))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def fetch(fake_python, directory, tmp_path):
    env = {**os.environ, "PYTHON": str(fake_python), "PIP_LOG": str(tmp_path / "pip.log")}
    return subprocess.run(["bash", str(ACCELERATOR / "fetch_wheels.sh"), str(directory)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_fetch_wheels_downloads_the_list_with_the_device_readme_line(fake_python, tmp_path):
    proc = fetch(fake_python, tmp_path / "whl", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pip = (tmp_path / "pip.log").read_text().split()
    readme = ("--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform "
              "manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 "
              "--platform manylinux2014_x86_64 --platform manylinux1_x86_64").split()
    assert " ".join(readme) in " ".join(pip)
    pins = [line.split("#")[0].strip() for line in (ACCELERATOR / "wheels.txt").read_text().splitlines()]
    assert [a for a in pip if "==" in a] == [p for p in pins if p]
    assert len(list((tmp_path / "whl").glob("*.whl"))) == len([p for p in pins if p])
    assert "fetch_wheels: 5 wheels" in proc.stdout and "MiB" in proc.stdout and "0 errors" in proc.stdout


def test_fetch_wheels_refuses_a_folder_with_another_wheel(fake_python, tmp_path):
    (tmp_path / "whl").mkdir()
    make_wheel(tmp_path / "whl", "dill", "0.3.9")
    proc = fetch(fake_python, tmp_path / "whl", tmp_path)
    assert proc.returncode == 1
    assert "ERROR two versions of dill" in proc.stdout


# ----------------------------------------------------------------------------------------------
# check_wheels.
# ----------------------------------------------------------------------------------------------


def wheels(tmp_path, *specs):
    return [cw.read_wheel(make_wheel(tmp_path, *spec)) for spec in specs]


def test_check_accepts_needs_met_by_carried_wheels_or_the_image(tmp_path):
    carried = wheels(tmp_path, ("lib-a", "1.0", ["lib-b>=0.4", "numpy>=2", "pandas", "fsspec<=2026.9",
                                                "colorama; sys_platform == 'win32'", "extra-dep; extra == 'x'"]),
                     ("lib-b", "0.4.1", []))
    found = cw.check(carried, {"numpy": "2.5.2", "pandas": None, "fsspec": None},
                     listed={"lib-a": "1.0", "lib-b": "0.4.1"}, required={"lib-a": "1.0", "numpy": "2.4.6"})
    assert found.errors == []
    assert found.unverified == ["lib-a 1.0 needs fsspec<=2026.9: in the image, version not read here"]
    assert found.notes == ["requirements.txt pins numpy==2.4.6; the image's 2.5.2 is what runs there"]


def test_check_finds_what_would_break_the_install_or_the_import(tmp_path):
    carried = wheels(tmp_path, ("lib-a", "1.0", ["dill<0.4.2", "numpy<2.5", "absent-lib"]), ("dill", "0.4.2", []),
                     ("old-py", "1.0", [], ">=3.13"))
    found = cw.check(carried, {"numpy": "2.5.2", "old-py": "0.9"}, listed={"lib-a": "1.0", "dill": "0.4.1"},
                     required={"scipy": None})
    text = "\n".join(found.errors)
    assert "lib-a 1.0 needs dill<0.4.2: carried it is 0.4.2" in text
    assert "lib-a 1.0 needs numpy<2.5: in the image it is 2.5.2" in text
    assert "lib-a 1.0 needs absent-lib: neither carried nor in the image" in text
    assert "Requires-Python >=3.13 excludes Python 3.12.3" in text
    assert "dill: wheels.txt pins 0.4.1, the wheel is 0.4.2" in text
    assert "old-py 1.0: a wheel that wheels.txt does not list" in text
    assert "runtime requirement scipy (requirements.txt) is neither carried nor in the image" in text
    assert any("old-py 1.0 is carried although the image has it" in n for n in found.notes)


def test_check_finds_two_versions_and_a_carried_wheel_that_is_not_the_one_imported(tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    carried = [cw.read_wheel(make_wheel(tmp_path / "one", "dill", "0.4.1")),
               cw.read_wheel(make_wheel(tmp_path / "two", "dill", "0.3.9"))]
    found = cw.check(carried, {}, installed={"dill": "0.3.8"})
    assert any(e.startswith("two versions of dill: 0.4.1 and 0.3.9") for e in found.errors)
    assert any("the carried 0.3.9 is not the one Python finds (0.3.8)" in e for e in found.errors)


def test_check_resolution_tells_carried_needs_from_the_image_stand_ins_needs(tmp_path):
    carried = wheels(tmp_path, ("datasets", "5.2.0", ["dill", "pandas"]), ("dill", "0.4.1", []))

    def item(name, version, requires=()):
        return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}}

    report = {"install": [item("datasets", "5.2.0", ["dill", "pandas", "new-dep"]), item("dill", "0.4.1"),
                          item("pandas", "3.1.1", ["python-dateutil"]), item("python-dateutil", "4.0", ["tzdata"]),
                          item("tzdata", "2026.6"), item("new-dep", "1.0"), item("numpy", "2.4.0")]}
    found = cw.check_resolution(report, carried, {"pandas": None, "python-dateutil": None, "numpy": "2.5.2"})
    assert found.errors == [
        "the resolution needs new-dep 1.0 (for datasets), neither carried nor in the image",
        "the resolution takes numpy 2.4.0, the image has 2.5.2"]
    assert any("tzdata 2026.6 (for python-dateutil)" in n and "only stand-ins" in n for n in found.notes)
    assert any("pandas 3.1.1, python-dateutil 4.0" in n for n in found.notes)


def test_check_wheels_command_reports_and_fails_on_an_error(tmp_path):
    make_wheel(tmp_path, "datasets", "5.2.0", ["no-such-package"])
    proc = subprocess.run([sys.executable, "-m", "bench.accelerator.check_wheels", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "ERROR datasets 5.2.0 needs no-such-package: neither carried nor in the image" in proc.stdout
    assert "ERROR ml-collections==1.1.0 is listed in wheels.txt but not among the wheels" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "bench.accelerator.check_wheels", str(tmp_path / "none")],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "no wheels" in proc.stdout


def test_a_wheel_built_for_another_python_is_an_error(tmp_path):
    assert cw.python_tag_fits("multiprocess-0.70.19-py312-none-any.whl", "3.12.3")
    assert cw.python_tag_fits("dill-0.4.1-py3-none-any.whl", "3.12.3")
    assert cw.python_tag_fits("six-1.17.0-py2.py3-none-any.whl", "3.12.3")
    assert cw.python_tag_fits("numpy-2.5.2-cp312-cp312-manylinux_2_28_x86_64.whl", "3.12.3")
    assert not cw.python_tag_fits("multiprocess-0.70.19-py311-none-any.whl", "3.12.3")
    assert cw.python_tag_fits("multiprocess-0.70.19-py311-none-any.whl", "3.11.0")
    carried = [cw.read_wheel(make_wheel(tmp_path, "multiprocess", "0.70.19", tag="py311-none-any"))]
    assert any("built for another Python than 3.12.3" in e for e in cw.check(carried, {}).errors)
    assert cw.check(carried, {}, python="3.11.0").errors == []
