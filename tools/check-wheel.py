#!/usr/bin/env python3
"""Checks a saltext.keycache wheel built by tools/build-wheel.sh.

    python tools/check-wheel.py WHEEL

Run by the test command (tools/test.sh) with the venv's python. Fails
(exit 1, one line per finding) unless:

* the wheel's tags (its file name and its WHEEL file) are abi3 for CPython
  3.10+ and a manylinux tag maturin wrote after its audit, for one machine
  (x86_64 or aarch64, from the name), and it is not pure Python;
* it holds the abi3 extension, the driver, the engine, the runners, the
  `salt.loader` entry point and the `keycache` CLI as an executable script,
  an ELF binary for the wheel's machine;
* pip resolves it for Python 3.14 (Salt 3008's onedir) and 3.11 (3006 and
  3007's), with `pip download` and `pip install --dry-run --target` as
  salt-pip does, on a manylinux2014 platform of its machine; and refuses it
  for Python 3.9, for a platform older than its glibc (manylinux_2_12) and
  for the other machine: the tags are what decide, not a lenient resolver.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

# The machines wheels are built for (tools/build-wheel.sh [TARGET]); the
# wheel's name says which one it is.
ARCHES = ("x86_64", "aarch64")
findings = []


def fail(msg):
    findings.append(msg)


def arch_of(name):
    """The machine of a wheel, from the last platform tag of its name."""
    m = re.search(r"_(x86_64|aarch64)\.whl$", name)
    return m.group(1) if m else None


def check_contents(path, arch):
    name = os.path.basename(path)
    m = re.fullmatch(r"saltext_keycache-([^-]+)-cp310-abi3-(\S+)\.whl", name)
    if not m:
        fail(f"{name}: not a cp310-abi3 wheel of saltext_keycache")
        return
    platforms = m.group(2).split(".")
    if not any(re.fullmatch(rf"manylinux_2_\d+_{arch}|manylinux2014_{arch}", p) for p in platforms):
        fail(f"{name}: no manylinux {arch} platform tag in {platforms}")
    if any(not p.endswith(f"_{arch}") for p in platforms):
        fail(f"{name}: platform tags of more than one machine: {platforms}")
    dist = f"saltext_keycache-{m.group(1)}"
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        wheel = z.read(f"{dist}.dist-info/WHEEL").decode()
        tags = {l.split(":", 1)[1].strip() for l in wheel.splitlines() if l.startswith("Tag:")}
        want = {f"cp310-abi3-{p}" for p in platforms}
        if tags != want:
            fail(f"{name}: WHEEL tags {sorted(tags)} differ from the file name's {sorted(want)}")
        if "Root-Is-Purelib: false" not in wheel:
            fail(f"{name}: WHEEL does not say Root-Is-Purelib: false")
        meta = z.read(f"{dist}.dist-info/METADATA").decode()
        if "Requires-Python: >=3.10" not in meta:
            fail(f"{name}: METADATA lacks Requires-Python: >=3.10")
        entry = z.read(f"{dist}.dist-info/entry_points.txt").decode()
        if not re.search(r"^\[salt\.loader\]\s*\nkeycache\s*=\s*saltext\.keycache\s*$", entry, re.M):
            fail(f"{name}: no salt.loader entry point keycache = saltext.keycache")
        for member in (
            "saltext/keycache/_native.abi3.so",
            "saltext/keycache/cache/keycache.py",
            "saltext/keycache/engines/keycache.py",
            "saltext/keycache/runners/keycache.py",
        ):
            if member not in names:
                fail(f"{name}: {member} missing")
        script = f"{dist}.data/scripts/keycache"
        if script not in names:
            fail(f"{name}: {script} (the CLI) missing")
        else:
            mode = z.getinfo(script).external_attr >> 16
            if mode & 0o111 != 0o111:
                fail(f"{name}: {script} is not executable (mode {oct(mode)})")
            head = z.read(script)[:20]
            if not head[:4] == b"\x7fELF":
                fail(f"{name}: {script} is not an ELF binary")
            elif int.from_bytes(head[18:20], "little") != ELF_MACHINE[arch]:
                fail(f"{name}: {script} is an ELF binary for machine {int.from_bytes(head[18:20], 'little')}, not {arch}")
        bad = [n for n in names if n.endswith(".so") and not n.endswith(".abi3.so")]
        if bad:
            fail(f"{name}: version-specific extensions {bad}")


# e_machine of an ELF header (bytes 18-19) for each machine.
ELF_MACHINE = {"x86_64": 62, "aarch64": 183}


def pip(*args):
    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True, text=True, env={**os.environ, "PIP_NO_INPUT": "1"},
    )


def resolve(links, version, platform, expect_ok, name):
    ver = version.replace(".", "")
    common = ["--no-index", "--find-links", links, "--only-binary=:all:", "--no-deps",
              "--python-version", version, "--implementation", "cp", "--abi", f"cp{ver}",
              "--platform", platform]
    with tempfile.TemporaryDirectory() as d:
        dl = pip("download", *common, "-d", d, "saltext.keycache")
        got = sorted(os.listdir(d))
        ok = dl.returncode == 0 and got == [name]
        if ok != expect_ok:
            fail(f"pip download for Python {version} on {platform}: exit {dl.returncode}, "
                 f"got {got}, expected {'the wheel' if expect_ok else 'a refusal'}: "
                 f"{dl.stderr.strip()[-300:]}")
    with tempfile.TemporaryDirectory() as d:
        report = os.path.join(d, "report.json")
        dry = pip("install", "--dry-run", "--ignore-installed", "--target", os.path.join(d, "t"),
                  *common, "--report", report, "saltext.keycache")
        picked = []
        if dry.returncode == 0:
            with open(report) as f:
                picked = [i["download_info"]["url"].rsplit("/", 1)[-1] for i in json.load(f)["install"]]
        ok = dry.returncode == 0 and picked == [name]
        if ok != expect_ok:
            fail(f"pip install --dry-run --target for Python {version} on {platform}: exit "
                 f"{dry.returncode}, picked {picked}, expected {'the wheel' if expect_ok else 'a refusal'}: "
                 f"{dry.stderr.strip()[-300:]}")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: check-wheel.py WHEEL")
    path = sys.argv[1]
    name = os.path.basename(path)
    arch = arch_of(name)
    if arch not in ARCHES:
        sys.exit(f"check-wheel: {name}: not a wheel for one of {', '.join(ARCHES)}")
    check_contents(path, arch)
    platform = f"manylinux2014_{arch}"
    # glibc 2.12 (manylinux2010's): older than the wheel's 2.17
    older = f"manylinux_2_12_{arch}"
    with tempfile.TemporaryDirectory() as links:
        shutil.copy(path, links)
        for version in ("3.14", "3.11", "3.10"):
            resolve(links, version, platform, True, name)
        resolve(links, "3.9", platform, False, name)
        resolve(links, "3.14", older, False, name)
        # a wheel of one machine is never picked for the other
        other = next(a for a in ARCHES if a != arch)
        resolve(links, "3.14", f"manylinux2014_{other}", False, name)
    for f in findings:
        print(f"check-wheel: {f}", file=sys.stderr)
    if findings:
        sys.exit(1)
    print(f"check-wheel: {name}: abi3 cp310+, manylinux {arch}, CLI inside; "
          f"resolves for Python 3.14, 3.11 and 3.10, refused for 3.9, {older} and {other}", file=sys.stderr)


if __name__ == "__main__":
    main()
