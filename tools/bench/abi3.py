#!/usr/bin/env python3
"""The abi3 build of saltext.keycache against a version-specific one, side by side.

    tools/bench.sh abi3 [--sizes 10000,100000] [--rounds 5] [--seconds 0.3]
        [--data DIR]

The shipped wheel is built for CPython's stable ABI (abi3, 3.10+), which
takes some of pyo3's fast paths away. This builds the same sources without
the `abi3` feature (a cp3XY wheel for this Python, `maturin build
--no-default-features`, zig and manylinux2014 like tools/build-wheel.sh),
installs each wheel with `pip install --target` into its own directory under
target/bench-abi3/, and runs tools/bench.sh driver (`--only pair,list
--drivers keycache,noop`, one round per run) alternately on each, the order
swapped every round, so that both see the same machine. Each run is checked to
have imported the build it was given.

Output: a Markdown table of the medians over rounds per build, and abi3's time
divided by the version-specific build's; with the sign-in pair's ratio to the
do-nothing driver (target <= 1.3x) and list_all's to Python's floor (target
<= 1.5x) per build. The abi3 wheel is the one tools/install-saltext.sh built
(target/wheels/); run that first.
"""

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORK = os.path.join(REPO, "target", "bench-abi3")


def log(msg):
    print(f"bench-abi3: {msg}", file=sys.stderr, flush=True)


def build_specific():
    out = os.path.join(WORK, "wheel-specific")
    subprocess.run(["rm", "-rf", out], check=True)
    venv_bin = os.path.dirname(sys.executable)
    log("building the version-specific wheel (maturin --no-default-features, zig)")
    subprocess.run(
        [os.path.join(venv_bin, "maturin"), "build", "--release", "--locked", "--zig", "--strip",
         "--compatibility", "manylinux2014", "--auditwheel", "check", "--no-default-features",
         "-i", sys.executable, "-m", os.path.join(REPO, "crates", "saltext-keycache", "Cargo.toml"),
         "-o", out],
        check=True, stdout=sys.stderr, env={**os.environ, "PATH": venv_bin + os.pathsep + os.environ["PATH"]})
    (wheel,) = glob.glob(os.path.join(out, "*.whl"))
    if "abi3" in os.path.basename(wheel):
        sys.exit(f"bench-abi3: {wheel} is abi3: the feature switch did not take")
    return wheel


def install(wheel, name):
    site = os.path.join(WORK, name)
    subprocess.run(["rm", "-rf", site], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--disable-pip-version-check", "--target", site, wheel], check=True)
    return site


def env_for(site):
    return {**os.environ, "PYTHONPATH": site}


def check_import(site):
    so = subprocess.run([sys.executable, "-c", "import saltext.keycache._native as n; print(n.__file__)"],
                        env=env_for(site), check=True, capture_output=True, text=True).stdout.strip()
    if not os.path.realpath(so).startswith(os.path.realpath(site) + os.sep):
        sys.exit(f"bench-abi3: with PYTHONPATH={site}, saltext.keycache._native came from {so}")
    return os.path.basename(so)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="10000,100000")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=0.3)
    p.add_argument("--data", default=os.path.join(REPO, "target", "bench-data"))
    a = p.parse_args()
    abi3 = sorted(glob.glob(os.path.join(REPO, "target", "wheels", "saltext_keycache-*-abi3-*.whl")),
                  key=os.path.getmtime)
    if not abi3:
        sys.exit("bench-abi3: no abi3 wheel in target/wheels: run tools/install-saltext.sh first")
    builds = {"abi3": install(abi3[-1], "abi3"), "specific": install(build_specific(), "specific")}
    names = {b: check_import(site) for b, site in builds.items()}
    log(f"builds: {names}")
    samples = {}  # (n, test, driver, build) -> [seconds]
    order = list(builds)
    for r in range(a.rounds):
        for b in (order if r % 2 == 0 else order[::-1]):
            cmd = [sys.executable, os.path.join(REPO, "tools", "bench", "driver.py"), "--json", "--rounds", "1",
                   "--seconds", str(a.seconds), "--sizes", a.sizes, "--only", "pair,list",
                   "--drivers", "keycache,noop", "--data", a.data]
            run = subprocess.run(cmd, env=env_for(builds[b]), capture_output=True, text=True)
            if run.returncode != 0:
                sys.exit(f"bench-abi3: {' '.join(cmd)} ({b}) failed:\n{run.stderr[-2000:]}")
            for s in json.loads(run.stdout)["samples"]:
                key = (s["minions"], s["test"], s["driver"], b)
                samples.setdefault(key, []).extend(s["seconds_per_op"])
        log(f"round {r + 1}/{a.rounds} done")

    def med(n, test, driver, b):
        v = samples.get((n, test, driver, b))
        return statistics.median(v) if v else None

    def fmt(s):
        return "—" if s is None else f"{s * 1e6:.2f} µs" if s < 1e-3 else f"{s * 1e3:.2f} ms"

    print(f"abi3 ({names['abi3']}) against the version-specific build ({names['specific']}), "
          f"{a.rounds} alternating rounds x {a.seconds} s, medians:\n")
    print("| minions | measurement | abi3 | version-specific | abi3 ÷ specific | abi3's target ratio | specific's target ratio |")
    print("|---|---|---:|---:|---:|---|---|")
    for n in sorted({k[0] for k in samples}):
        for test, label, ref, limit in (
            ("pair", "sign-in pair via Cache", "noop", 1.3),
            ("list_all keys", "list_all('keys')", "floor", 1.5),
            ("list_all keys+data", "list_all('keys', include_data=True)", "floor", 1.5),
        ):
            x, y = med(n, test, "keycache", "abi3"), med(n, test, "keycache", "specific")
            if x is None or y is None:
                continue

            def target(b, kc):
                o = med(n, test, ref, b)
                if o is None:
                    return "—"
                return f"{kc / o:.2f}x {ref} ({'met' if kc <= limit * o else '**not met**'}: <= {limit}x)"
            print(f"| {n:,} | {label} | {fmt(x)} | {fmt(y)} | {x / y:.2f}x | {target('abi3', x)} | {target('specific', y)} |")


if __name__ == "__main__":
    main()
