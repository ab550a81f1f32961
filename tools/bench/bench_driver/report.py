"""The report: the Markdown table of medians, keycache's ratios and targets."""

from .common import FLOOR, FLOOR_OWN, TABLE_DRIVERS


def fmt_time(s):
    if s is None:
        return "—"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.2f} µs"


def fmt_rate(s, unit):
    if s is None:
        return "—"
    r = 1 / s
    if r >= 1e6:
        txt = f"{r / 1e6:.2f} M "
    elif r >= 1e3:
        txt = f"{r / 1e3:.1f} k "
    else:
        txt = f"{r:.0f} "
    return f"{txt}{unit}/s ({fmt_time(s)})"


def fmt_x(a, b):
    """b ÷ a: how many times faster a is than b."""
    if a is None or b is None or a <= 0:
        return "—"
    x = b / a
    return f"{x:.2f}x" if x < 10 else f"{x:.1f}x" if x < 100 else f"{x:.0f}x"


TESTS = (
    # (test key, label, unit (rate) or None (time per call))
    ("pair", "sign-in pair via Cache", "pairs"),
    ("direct", "sign-in pair, direct call", "pairs"),
    ("list_all keys", "list_all('keys') via Cache", None),
    ("list_all keys+data", "list_all('keys', include_data=True) via Cache", None),
    ("list denied_keys", "list('denied_keys') via Cache", None),
    ("store replace", "store of an accepted key (replace) via Cache", "stores"),
    ("store new", "store of new keys one by one via Cache", "keys"),
)


def target_of(test, kc, res_get):
    """(target text, met: True/False/None)."""
    mk = res_get("mmap_key")
    lf = res_get("localfs_key")
    noop = res_get("noop")
    if test == "pair":
        ok = None if kc is None or noop is None else kc <= 1.3 * noop
        return "keycache's time <= 1.3x the do-nothing driver's", ok
    if test == "direct":
        ok = None if kc is None or mk is None else mk / kc >= 20
        return ">= 20x mmap_key's pair", ok
    if test in ("list_all keys", "list_all keys+data"):
        oks = []
        if kc is not None and mk is not None:
            oks.append(mk / kc >= 15)
        if kc is not None and lf is not None:
            oks.append(lf / kc >= 100)
        return ">= 15x mmap_key and >= 100x localfs_key", (all(oks) if oks else None)
    return "reported (against mmap_key)", None


def report(args, results):
    lines = []
    sizes = sorted({k[0] for k in results.samples})
    header = "| minions | measurement | do-nothing | keycache | mmap_key | localfs_key | keycache's time ÷ do-nothing's | mmap_key's time ÷ keycache's | localfs_key's time ÷ keycache's | target | met |"
    lines.append(header)
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
    store_new = f"store {args.store_count} new"
    rows_json = []
    for n in sizes:
        for test, label, unit in TESTS:
            key = store_new if test == "store new" else test
            variants = [("keycache", " (keycache: its shim module's functions)" if test == "direct" else "")]
            if test == "direct":
                variants += [(d, f" ({d[len('keycache '):]})") for d in sorted({k[2] for k in results.samples if k[0] == n and k[1] == key and k[2].startswith("keycache ")})]
            if test.startswith("store"):
                variants.append(("keycache_notree", " (keycache_tree: False)"))
            for kcname, suffix in variants:
                def get(d, n=n, key=key):
                    return results.median(n, key, d)
                kc = get(kcname)
                if all(get(d) is None for d in TABLE_DRIVERS) and kc is None:
                    continue
                if kcname != "keycache" and kc is None:
                    continue
                fmt = (lambda s: fmt_rate(s, unit)) if unit else fmt_time
                lab = label.replace("new keys", f"{args.store_count} new keys") + suffix
                noop_ratio = "—" if kc is None or get("noop") is None else f"{kc / get('noop'):.2f}x"
                tgt, ok = target_of(test, kc, get)
                if kcname != "keycache" and test != "direct":
                    tgt, ok = "reported", None
                met = "—" if ok is None else ("yes" if ok else "**no**")
                lines.append(
                    f"| {n:,} | {lab} | {fmt(get('noop'))} | {fmt(kc)} | {fmt(get('mmap_key'))} | "
                    f"{fmt(get('localfs_key'))} | {noop_ratio} | {fmt_x(kc, get('mmap_key'))} | "
                    f"{fmt_x(kc, get('localfs_key'))} | {tgt} | {met} |")
                rows_json.append({"minions": n, "test": key, "keycache_variant": kcname,
                                  "median_seconds": {d: get(d) for d in TABLE_DRIVERS + (kcname,)},
                                  "target": tgt, "met": ok})
    # Lines measured for drivers without keycache (development runs): the table above shows them too.
    text = "\n".join(lines)
    etcd_text, etcd_rows = etcd_table(args, results, sizes)
    if etcd_text:
        text += "\n\n" + etcd_text
        rows_json.extend(etcd_rows)
    floor_text, floor_rows = floor_table(results, sizes)
    if floor_text:
        text += "\n\n" + floor_text
        rows_json.extend(floor_rows)
    extra = []
    direct_other = sorted({k[2] for k in results.samples if k[1] == "direct" and k[2] not in TABLE_DRIVERS and not k[2].startswith("keycache ")})
    if direct_other:
        extra.append(f"other direct lines: {direct_other}")
    for note in results.notes:
        extra.append(f"- {note}")
    if results.errors:
        extra.append("ERRORS:")
        extra.extend(f"- {e}" for e in results.errors)
    return text + ("\n\n" + "\n".join(extra) if extra else ""), rows_json


ETCD = "keycache-etcd"


def etcd_table(args, results, sizes):
    """The table of keycache in etcd mode: its medians beside the do-nothing driver's,
    keycache's (local store) and mmap_key's, measured in the same rounds, and its time
    divided by each. Targets: the pair within 1.3x the do-nothing driver's; stores reported
    against mmap_key's local store. Returns (text, JSON rows); ("", []) when not measured."""
    lines = [
        "keycache in etcd mode (keycache-etcd: writes through etcd, each returning once the "
        "local replica applied it; reads local):",
        "",
        "| minions | measurement | do-nothing | keycache (local) | keycache-etcd | mmap_key (local) "
        "| keycache-etcd's time ÷ do-nothing's | ÷ keycache's | ÷ mmap_key's | target | met |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    rows = []
    store_new = f"store {args.store_count} new"
    for n in sizes:
        for test, label, unit in TESTS:
            key = store_new if test == "store new" else test

            def get(d, n=n, key=key):
                return results.median(n, key, d)
            e = get(ETCD)
            if e is None:
                continue
            fmt = (lambda s, unit=unit: fmt_rate(s, unit)) if unit else fmt_time

            def ratio(d, e=e, get=get):
                o = get(d)
                return "—" if o is None or o <= 0 else f"{e / o:.2f}x"
            if test == "pair":
                noop = get("noop")
                ok = None if noop is None else e <= 1.3 * noop
                tgt = "keycache-etcd's time <= 1.3x the do-nothing driver's"
            else:
                ok = None
                tgt = "reported (against mmap_key)" if test.startswith("store") else "reported"
            met = "—" if ok is None else ("yes" if ok else "**no**")
            lab = label.replace("new keys", f"{args.store_count} new keys")
            lines.append(
                f"| {n:,} | {lab} | {fmt(get('noop'))} | {fmt(get('keycache'))} | {fmt(e)} | "
                f"{fmt(get('mmap_key'))} | {ratio('noop')} | {ratio('keycache')} | {ratio('mmap_key')} | "
                f"{tgt} | {met} |")
            rows.append({"minions": n, "test": key, "keycache_variant": ETCD,
                         "median_seconds": {d: get(d) for d in ("noop", "keycache", ETCD, "mmap_key")},
                         "target": tgt, "met": ok})
    if not rows:
        return "", []
    return "\n".join(lines), rows


def floor_table(results, sizes):
    """keycache's list_all against Python building the same dict from ready lists
    (ids, states and keys already str objects), measured in the same rounds. Target:
    within 1.5x, with and without data. With data, also against the same floor with a
    key str of its own per entry (FLOOR_OWN). Returns (text, JSON rows); ("", []) when
    not measured."""
    lines = [
        "list_all against Python's floor (the same dict built in Python from ready lists):",
        "",
        "| minions | measurement | Python's floor | keycache | keycache's time ÷ the floor's | target | met "
        "| the floor with a key str per entry | keycache's time ÷ that |",
        "|---|---|---:|---:|---:|---|---|---:|---:|",
    ]
    rows = []
    for n in sizes:
        for test, label, _ in TESTS:
            floor = results.median(n, test, FLOOR)
            kc = results.median(n, test, "keycache")
            if floor is None or kc is None:
                continue
            own = results.median(n, test, FLOOR_OWN)
            ok = kc <= 1.5 * floor
            tgt = "keycache's time <= 1.5x the floor's"
            lines.append(f"| {n:,} | {label} | {fmt_time(floor)} | {fmt_time(kc)} | {kc / floor:.2f}x | {tgt} | "
                         f"{'yes' if ok else '**no**'} | {fmt_time(own) if own else '—'} | "
                         f"{f'{kc / own:.2f}x' if own else '—'} |")
            medians = {FLOOR: floor, "keycache": kc}
            if own:
                medians[FLOOR_OWN] = own
            rows.append({"minions": n, "test": test, "keycache_variant": "keycache",
                         "median_seconds": medians, "target": tgt, "met": ok})
    if not rows:
        return "", []
    return "\n".join(lines), rows
