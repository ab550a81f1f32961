"""The legacy key tree (``minions/<id>`` and its siblings) as the driver keeps it.

Shared by the interop and concurrency tests: what the tree must hold for an
id, compared with what it does hold.
"""

import os

# Tree directory of each key state (the denied bank's is minions_denied).
TREE_DIR = {
    "accepted": "minions",
    "pending": "minions_pre",
    "rejected": "minions_rejected",
    "denied": "minions_denied",
}


def id_problems(pki, mid, want):
    """Disagreements for *mid*: *want* maps a tree directory to the key its
    ``<dir>/<mid>`` file must hold; every other directory must not hold one."""
    problems = []
    for dirname in TREE_DIR.values():
        path = os.path.join(pki, dirname, mid)
        if dirname in want:
            try:
                with open(path, "rb") as fh:
                    data = fh.read()
            except OSError as exc:
                problems.append(f"{path}: {exc}")
                continue
            if data != want[dirname].encode():
                problems.append(f"{path}: content differs from the bank")
        elif os.path.lexists(path):
            problems.append(f"{path}: exists, the bank does not hold {mid!r} there")
    return problems
