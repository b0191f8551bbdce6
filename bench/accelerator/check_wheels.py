"""Do the carried wheels fit the lent machine's image? (issue 40)

``python -m bench.accelerator.check_wheels DIR`` reads every wheel in DIR (name, version, Requires-Python,
Requires-Dist) and checks, with ``packaging``, against the image's packages (image_packages.txt, the
versions KINDS.md gives) on CPython 3.12.3, manylinux x86-64:

- one version of each distribution (two stop ``pip install``), each one listed in wheels.txt;
- each wheel installs on Python 3.12;
- each requirement of a wheel (its markers evaluated there, no extras) is met by another carried wheel or
  by the image: in the version it needs where the image's version is known, else listed as unverified;
- each runtime requirement (requirements.txt) is carried or in the image.

``--installed`` checks against the packages of the running interpreter instead (the device command runs it
there, after installing the wheels on PYTHONPATH): every version is known then, and each carried
distribution must be the one Python imports. ``--pip-report FILE`` also checks a ``pip install --dry-run
--report FILE`` resolution (bench/accelerator/fetch_wheels.sh with RESOLVE=1): everything it would install
is carried (in the carried version) or in the image (in the image's version where known).

Exit status 0 when nothing is wrong (unverified versions are listed, not failures), 1 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import email.parser
import json
import pathlib
import re
import sys
import zipfile

try:
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version
except ImportError:  # an interpreter without packaging: pip's own copy
    from pip._vendor.packaging.markers import default_environment
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.specifiers import SpecifierSet
    from pip._vendor.packaging.version import Version

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
IMAGE_PACKAGES = HERE / "image_packages.txt"
WHEELS = HERE / "wheels.txt"
REQUIREMENTS = REPO / "requirements.txt"

IMAGE_PYTHON = "3.12.3"  # KINDS.md: python3 there is Python 3.12.3
# The marker environment of the image's interpreter (CPython 3.12 on Linux x86-64).
IMAGE_MARKERS = {
    "python_version": "3.12", "python_full_version": IMAGE_PYTHON, "implementation_name": "cpython",
    "implementation_version": IMAGE_PYTHON, "platform_python_implementation": "CPython", "os_name": "posix",
    "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "extra": "",
}


def canonical(name: str) -> str:
    """PEP 503's normalized name (``tensorboardX`` -> ``tensorboardx``, ``ml_collections`` -> ``ml-collections``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: pathlib.Path) -> dict[str, str | None]:
    """{canonical name: version or None} of a file of ``NAME`` / ``NAME==VERSION`` lines (``#`` comments,
    blank lines and pip options such as ``-r`` skipped): image_packages.txt, wheels.txt, requirements.txt."""
    pins: dict[str, str | None] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        req = Requirement(line)
        exact = [s.version for s in req.specifier if s.operator == "=="]
        name = canonical(req.name)
        if name in pins:
            raise ValueError(f"{path}: {req.name} is listed twice")
        pins[name] = exact[0] if exact else None
    return pins


@dataclasses.dataclass(frozen=True)
class Wheel:
    file: str
    name: str  # canonical
    version: str
    requires_python: str | None
    requires: tuple[str, ...]  # Requires-Dist lines


def read_wheel(path: pathlib.Path) -> Wheel:
    """A wheel's name, version and requirements, from its ``*.dist-info/METADATA``."""
    with zipfile.ZipFile(path) as zf:
        metadata = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if len(metadata) != 1:
            raise ValueError(f"{path.name}: {len(metadata)} *.dist-info/METADATA files")
        msg = email.parser.Parser().parsestr(zf.read(metadata[0]).decode("utf-8"), headersonly=True)
    return Wheel(path.name, canonical(msg["Name"]), msg["Version"], msg.get("Requires-Python"),
                 tuple(msg.get_all("Requires-Dist") or ()))


def python_tag_fits(file: str, python: str) -> bool:
    """Whether a wheel file name's Python tag (``py3``, ``py312``, ``cp312``, ``py2.py3``) installs on
    CPython ``python`` (e.g. "3.12.3")."""
    parts = file[: -len(".whl")].split("-")
    if len(parts) < 5:
        return True  # not a standard wheel name: pip will say
    major, minor = python.split(".")[:2]
    return bool(set(parts[-3].split(".")) & {f"py{major}", f"py{major}{minor}", f"cp{major}{minor}"})


def installed_packages() -> dict[str, str]:
    """{canonical name: version} of the running interpreter's distributions (the first on sys.path wins,
    as for imports)."""
    import importlib.metadata

    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonical(name), dist.version)
    return found


@dataclasses.dataclass
class Findings:
    errors: list[str] = dataclasses.field(default_factory=list)
    unverified: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    def text(self) -> str:
        lines = [f"ERROR {e}" for e in self.errors] + [f"unverified {u}" for u in self.unverified]
        lines += [f"note {n}" for n in self.notes]
        return "\n".join(lines + [f"{len(self.errors)} errors, {len(self.unverified)} unverified"])


def check(wheels: list[Wheel], image: dict[str, str | None], *, listed: dict[str, str | None] | None = None,
          required: dict[str, str | None] | None = None, markers: dict[str, str] | None = None,
          python: str = IMAGE_PYTHON, installed: dict[str, str] | None = None) -> Findings:
    """What is wrong with carrying ``wheels`` to a machine holding ``image`` ({name: version or None}).

    ``listed``: wheels.txt (each wheel must be one of its pins, each pin fetched); ``required``:
    requirements.txt (each name carried or in the image); ``installed``: what the running interpreter
    imports ({name: version}), where the carried version must win."""
    markers = IMAGE_MARKERS if markers is None else markers
    out = Findings()
    carried: dict[str, str] = {}
    for wheel in wheels:
        if wheel.name in carried:
            out.errors.append(f"two versions of {wheel.name}: {carried[wheel.name]} and {wheel.version} "
                              "(pip install stops at the first conflict)")
        carried[wheel.name] = wheel.version
        if wheel.requires_python and Version(python) not in SpecifierSet(wheel.requires_python):
            out.errors.append(f"{wheel.file}: Requires-Python {wheel.requires_python} excludes Python {python}")
        if not python_tag_fits(wheel.file, python):
            out.errors.append(f"{wheel.file}: built for another Python than {python} (its file name's tag)")
        if wheel.name in image and installed is None:
            out.notes.append(f"{wheel.name} {wheel.version} is carried although the image has it "
                             f"({image[wheel.name] or 'version not read'}): the carried one shadows it")
    if listed is not None:
        for name, version in listed.items():
            if name not in carried:
                out.errors.append(f"{name}=={version} is listed in wheels.txt but not among the wheels")
            elif version is not None and carried[name] != version:
                out.errors.append(f"{name}: wheels.txt pins {version}, the wheel is {carried[name]}")
        for name in carried.keys() - listed.keys():
            out.errors.append(f"{name} {carried[name]}: a wheel that wheels.txt does not list")
    for wheel in wheels:
        for line in wheel.requires:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(markers):
                continue
            name, need = canonical(req.name), f"{wheel.name} {wheel.version} needs {line.split(';')[0].strip()}"
            if name in carried:
                have, where = carried[name], "carried"
            elif name in image:
                have, where = image[name], "in the image"
            else:
                out.errors.append(f"{need}: neither carried nor in the image")
                continue
            if req.extras:
                out.unverified.append(f"{need}: the extras' own requirements are not checked here")
            if not req.specifier:
                continue  # any version will do
            if have is None:
                out.unverified.append(f"{need}: in the image, version not read here")
            elif not req.specifier.contains(Version(have), prereleases=True):
                out.errors.append(f"{need}: {where} it is {have}")
    for name, version in (required or {}).items():
        if name not in carried and name not in image:
            out.errors.append(f"runtime requirement {name} (requirements.txt) is neither carried nor in the image")
        elif name not in carried and version is not None and image.get(name) not in (None, version):
            out.notes.append(f"requirements.txt pins {name}=={version}; the image's {image[name]} is what runs there")
    for name, version in carried.items():
        if installed is not None and installed.get(name) != version:
            out.errors.append(f"{name}: the carried {version} is not the one Python finds "
                              f"({installed.get(name) or 'none'}): is the target directory first on PYTHONPATH?")
    return out


def check_resolution(report: dict, wheels: list[Wheel], image: dict[str, str | None],
                     markers: dict[str, str] | None = None) -> Findings:
    """Whether a ``pip install --dry-run --report`` resolution installs only carried wheels (their
    versions) and image packages (the image's versions where known). A package neither carried nor in
    the image is an error when a carried wheel needs it; when only a stand-in of an image package needs
    it (the stand-in's version may not be the image's), it is a note: that is the image's business."""
    markers = IMAGE_MARKERS if markers is None else markers
    out = Findings()
    carried = {w.name: w.version for w in wheels}
    items = report.get("install", [])
    unread: list[str] = []
    needed_by: dict[str, set[str]] = {}
    for item in items:
        for line in item["metadata"].get("requires_dist") or ():
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate(markers):
                needed_by.setdefault(canonical(req.name), set()).add(canonical(item["metadata"]["name"]))
    for item in items:
        name, version = canonical(item["metadata"]["name"]), item["metadata"]["version"]
        if name in carried:
            if version != carried[name]:
                out.errors.append(f"the resolution takes {name} {version}, the carried wheel is {carried[name]}")
        elif name not in image:
            by = sorted(needed_by.get(name, ()))
            message = (f"the resolution needs {name} {version} (for {', '.join(by) or 'nothing'}), neither carried "
                       "nor in the image")
            if set(by) & carried.keys() or not by:
                out.errors.append(message)
            else:
                out.notes.append(message + ": only stand-ins of the image's packages need it")
        elif image[name] is None:
            unread.append(f"{name} {version}")
        elif image[name] != version:
            out.errors.append(f"the resolution takes {name} {version}, the image has {image[name]}")
    if unread:
        out.notes.append(f"the resolution takes these of the image's packages, whose versions are not read here, "
                         f"as: {', '.join(unread)}")
    for name in carried.keys() - {canonical(i["metadata"]["name"]) for i in items}:
        out.notes.append(f"{name} is carried but the resolution does not need it")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=pathlib.Path, help="the folder of carried wheels")
    parser.add_argument("--installed", action="store_true",
                        help="check against the running interpreter's packages (on the device) instead of "
                             "image_packages.txt")
    parser.add_argument("--pip-report", type=pathlib.Path, help="also check this pip --dry-run --report JSON")
    parser.add_argument("--python", default=IMAGE_PYTHON,
                        help=f"the Python the wheels are for, without --installed (default {IMAGE_PYTHON}: the "
                             "image's)")
    args = parser.parse_args(argv)
    wheels = [read_wheel(p) for p in sorted(args.dir.glob("*.whl"))]
    if not wheels:
        print(f"no wheels in {args.dir}")
        return 1
    if args.installed:
        import platform

        image = installed = installed_packages()  # the carried wheels among them, first on PYTHONPATH
        findings = check(wheels, image, listed=read_pins(WHEELS), required=read_pins(REQUIREMENTS),
                         markers=default_environment() | {"extra": ""}, python=platform.python_version(),
                         installed=installed)
    else:
        image = read_pins(IMAGE_PACKAGES)
        markers = IMAGE_MARKERS | {"python_version": ".".join(args.python.split(".")[:2]),
                                   "python_full_version": args.python}
        findings = check(wheels, image, listed=read_pins(WHEELS), required=read_pins(REQUIREMENTS),
                         markers=markers, python=args.python)
    for wheel in wheels:
        print(f"wheel {wheel.name} {wheel.version} ({wheel.file})")
    if args.pip_report:
        resolution = check_resolution(json.loads(args.pip_report.read_text()), wheels, image)
        findings.errors += resolution.errors
        findings.unverified += resolution.unverified
        findings.notes += resolution.notes
    print(findings.text())
    return int(bool(findings.errors))


if __name__ == "__main__":
    sys.exit(main())
