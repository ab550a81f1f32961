#!/usr/bin/env python3
"""Put the `keycache` CLI into the saltext.keycache wheel.

    wheel_add_binary.py EXT_WHEEL BIN_WHEEL OUT_DIR

maturin builds a pyo3 extension or a binary into a wheel, never both, so
tools/build-wheel.sh builds the two (each audited by maturin for the same
manylinux tag) and this script copies the binary wheel's
`<name>.data/scripts/keycache` (and its SBOM) into the extension wheel as
`saltext_keycache-<version>.data/scripts/keycache`, the place pip installs
scripts from: `<prefix>/bin` in a venv, `DIR/bin` with `pip install --target
DIR` (salt-pip). RECORD is rewritten with each added file's hash and size,
as the wheel spec (PEP 427) asks. The result, under the extension wheel's
name, goes to OUT_DIR; its path is printed.
"""

import base64
import hashlib
import os
import sys
import zipfile


def record_hash(data):
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def main(argv):
    if len(argv) != 4:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    ext_path, bin_path, out_dir = argv[1:]
    ext_name = os.path.basename(ext_path)
    dist, version = ext_name.split("-")[:2]
    data_dir = f"{dist}-{version}.data"
    info_dir = f"{dist}-{version}.dist-info"

    added = []  # (arcname, bytes, unix mode)
    with zipfile.ZipFile(bin_path) as b:
        for info in b.infolist():
            parts = info.filename.split("/")
            if parts[0].endswith(".data") and parts[1:] == ["scripts", "keycache"]:
                added.append((f"{data_dir}/scripts/keycache", b.read(info), 0o755))
            elif parts[0].endswith(".dist-info") and parts[1:2] == ["sboms"]:
                added.append((f"{info_dir}/sboms/{parts[-1]}", b.read(info), 0o644))
    if not any(name.endswith("/scripts/keycache") for name, _, _ in added):
        sys.exit(f"wheel_add_binary: {bin_path} has no .data/scripts/keycache")

    os.makedirs(out_dir, exist_ok=True)
    out_path = os.path.join(out_dir, ext_name)
    if os.path.abspath(out_path) == os.path.abspath(ext_path):
        sys.exit("wheel_add_binary: OUT_DIR must differ from the extension wheel's directory")
    tmp = out_path + ".tmp"
    with zipfile.ZipFile(ext_path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        names = {i.filename for i in src.infolist()}
        clash = [n for n, _, _ in added if n in names]
        if clash:
            sys.exit(f"wheel_add_binary: {ext_path} already holds {clash}")
        record_name = f"{info_dir}/RECORD"
        record = None
        for info in src.infolist():
            if info.filename == record_name:
                record = src.read(info).decode()
                continue
            dst.writestr(info, src.read(info))
        if record is None:
            sys.exit(f"wheel_add_binary: {ext_path} has no {record_name}")
        lines = [l for l in record.splitlines() if l and not l.startswith(record_name + ",")]
        for name, data, mode in added:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            dst.writestr(info, data)
            lines.append(f"{name},{record_hash(data)},{len(data)}")
        lines.append(f"{record_name},,")
        info = zipfile.ZipInfo(record_name, date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = 0o100644 << 16
        dst.writestr(info, "\n".join(lines) + "\n", zipfile.ZIP_DEFLATED)
    os.replace(tmp, out_path)
    print(out_path)


if __name__ == "__main__":
    main(sys.argv)
