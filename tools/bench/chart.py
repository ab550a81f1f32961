#!/usr/bin/env python3
"""Draw the lookup chart of a `compare` run: lookups per second against store
size, one line per contender, existing ids and absent ids side by side.

    tools/bench.sh chart RESULTS.json OUT.png

RESULTS.json is what `target/release/examples/compare run` writes (see
tools/bench.sh compare). Needs matplotlib (tools/bench.sh compare installs it
into a venv under target/).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

STYLE = {
    "keycache get": ("#d62728", "o", "-"),
    "keycache get_many(64)": ("#d62728", "s", "--"),
    "keycache get_in (reused buffer)": ("#ff7f0e", "o", "-"),
    "keycache Reader::get_in (handle per thread)": ("#9467bd", "o", "-"),
    "keycache get_many_in(64) (reused batch)": ("#ff7f0e", "s", "--"),
    "hashbrown HashMap (in memory)": ("#1f77b4", "^", "-"),
    "hashbrown + copy-out and xxh3 check (in memory)": ("#1f77b4", "^", ":"),
    "std HashMap (in memory)": ("#17becf", "v", "-"),
    "LMDB/heed, txn per lookup": ("#2ca02c", "D", "-"),
    "LMDB/heed, one txn per thread": ("#2ca02c", "d", "--"),
    "Salt 3008.5 mmap_key.fetch": ("#7f7f7f", "x", "-"),
}


def label(n):
    n = int(n)
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


def rate(v, _pos=None):
    if v >= 1e6:
        return f"{v / 1e6:g}M"
    if v >= 1e3:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    res = json.load(open(sys.argv[1]))
    lookup = res.get("lookup") or {}
    if not lookup:
        sys.exit("no lookup results in " + sys.argv[1])
    sizes = sorted(lookup, key=int)
    contenders = [c for c in STYLE if any(c in lookup[s] for s in sizes)]
    panels = (
        ("hit/1t", "existing ids, 1 thread"),
        ("hit/2t", "existing ids, 2 threads"),
        ("miss/1t", "absent ids, 1 thread"),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(16, 5.6), sharey=True)
    handles = {}
    for ax, (key, title) in zip(axes, panels):
        for c in contenders:
            xs, ys = [], []
            for s in sizes:
                m = lookup[s].get(c, {})
                if key in m:
                    xs.append(int(s))
                    ys.append(m[key]["median"])
            if not xs:
                continue
            color, marker, ls = STYLE[c]
            (h,) = ax.plot(xs, ys, color=color, marker=marker, linestyle=ls, label=c, linewidth=1.8)
            handles.setdefault(c, h)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks([int(s) for s in sizes])
        ax.set_xticklabels([label(s) for s in sizes])
        ax.minorticks_off()
        ax.yaxis.set_major_formatter(FuncFormatter(rate))
        ax.set_xlabel("minions in the store")
        ax.set_title(f"Lookup of {title}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("lookups per second, all threads (median of rounds)")
    fig.legend(
        [handles[c] for c in contenders if c in handles],
        [c for c in contenders if c in handles],
        loc="lower center",
        ncol=4,
        fontsize=9,
        frameon=False,
    )
    m = res.get("machine_before", {})
    fig.suptitle(
        f"keycache vs alternatives — {m.get('cpu', '?')}, {m.get('cores', '?')} cores; "
        "each lookup returns state + 451-byte PEM key and the caller sums every byte;\n"
        "Salt: Python, one process per thread; 2 threads = 2 processes",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(sys.argv[2], dpi=110)
    print(sys.argv[2])


if __name__ == "__main__":
    main()
