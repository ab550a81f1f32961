"""Type stubs of saltext.keycache._native (the pyo3 core)."""

from typing import Any, Callable, Literal, Mapping, Optional, Union

MAX_KEPT_VALUES: int
"""How many value strs (public keys) a bank keeps between listings (100,000)."""
LIST_BESIDE_FROM: int
"""From how many roster entries a listing walks the bank on a second thread (4,096)."""

def walks_beside() -> int:
    """How many listings of this process walked their bank on a second thread."""

def can_walk_beside() -> bool:
    """Whether this process's listings of large banks walk on a second thread (two CPUs)."""

class KeycacheError(Exception):
    """Raised when no SaltCacheError class was registered."""

class Driver:
    """Salt's key cache functions on one store directory (mmap_key's values and errors)."""

    @property
    def dir(self) -> str: ...
    def fetch(self, bank: str, key: Any) -> Any:
        """keys: {"state", "pub"} or None; denied_keys: [pub] or {}; master_keys: str or {}."""
    def store(self, bank: str, key: Any, data: Any) -> None:
        """Writes durably (the GIL released); keeps the key tree in step when enabled."""
    def flush(self, bank: str, key: Optional[Any] = None) -> bool:
        """Removes key, or with key=None the whole bank (its files)."""
    def list(self, bank: str) -> list[str]: ...
    def list_all(self, bank: str, include_data: bool = False) -> dict[str, Any]:
        """keys: {id: {"state"[, "pub"]}}; denied_keys: {id: [pub]}."""
    def contains(self, bank: str, key: Optional[Any] = None) -> bool: ...
    def updated(self, bank: str, key: Any) -> Optional[int]: ...

def driver(
    dir: str,
    *,
    size: int,
    slot_size: int,
    id_size: int,
    max_segment_bytes: int,
    tree: Union[bool, Literal["accepted"]],
    pki_dir_is_abs: bool,
    master_pki_dir: Optional[str] = None,
    master_id: str = "",
    etcd: Optional[dict[str, Any]] = None,
    cluster_id: Optional[str] = None,
    program: Optional[str] = None,
    audit_master: Optional[str] = None,
) -> Driver:
    """The process-wide driver of dir with this layout (opened once, kept across loader reloads).

    tree (keycache_tree): the whole key tree kept in step (True), none of it (False), or
    minions/ alone ("accepted").

    With etcd (keycache_etcd), store and flush of keys and denied_keys go through etcd.

    Every change is recorded in the audit trail as made by program (default: audit_program())
    for the master audit_master (the master options' id), by this process's OS user and
    SUDO_USER."""

def replicate(
    dir: str,
    *,
    size: int,
    slot_size: int,
    id_size: int,
    max_segment_bytes: int,
    etcd: Optional[dict[str, Any]],
    tree: Union[bool, Literal["accepted"], None] = None,
    cluster_id: Optional[str] = None,
    report: Optional[Callable[[str, str], Any]] = None,
    master_pki_dir: Optional[str] = None,
    master_id: str = "",
) -> None:
    """Runs the replicator of dir from etcd (the GIL released) until a signal handler raises.

    tree as for driver; None: the whole tree."""

def last_etcd_revision() -> int:
    """The etcd revision at which this thread's last store or flush through etcd took effect (0: none)."""

def audit_history(
    dir: str, id: Optional[str] = None, since: Optional[str] = None
) -> tuple[list[dict[str, Any]], int]:
    """The audit trail of the store in dir, oldest first, and how many lines could not be read.

    Each record a dict of the log's fields (time, id, action, from, to, finger, replaced_finger,
    user, sudo_user, program, master, reason, revision); id: that minion's alone; since (RFC 3339
    or a date): those made then or later (ValueError for anything else)."""

def audit_program() -> str:
    """The program this process's changes are recorded as: the base name of sys.argv[0]."""

# The runner functions' jobs (salt-run keycache.*): the library's, as the keycache command runs
# them, on Salt's master opts (__opts__: pki_dir, cluster_id, cluster_pki_dir, mmap_key_*, id,
# keycache_tree, keycache_etcd). Each returns the document the command's --json prints and
# whether it passed (the command's exit code 0); an error raises the registered error class.

def run_migrate(
    opts: Mapping[str, Any], *, dry_run: bool = False, replace_states: bool = False
) -> tuple[dict[str, Any], bool]:
    """keycache migrate: the master's localfs_key tree and own keys into its store (dry_run: nothing written)."""

def run_stats(opts: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """keycache stats: counts per state, each bank's slots, probe lengths and heap."""

def run_verify(opts: Mapping[str, Any], *, repair: bool = False) -> tuple[dict[str, Any], bool]:
    """keycache verify [--repair]: the banks and the key tree; passed when clean (or repaired clean)."""

def run_diff(opts: Mapping[str, Any], other: str) -> tuple[dict[str, Any], bool]:
    """keycache diff <the master's store> <other>: passed when they hold the same entries."""

def run_etcd_status(opts: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """keycache etcd status: the replica against etcd; passed when current and etcd answered."""

def run_etcd_diff(opts: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """keycache etcd diff: the master's store against etcd; passed when the same."""

def set_error_class(cls: type) -> None:
    """Registers the exception class errors are raised as (Salt's SaltCacheError)."""

def after_fork_in_child() -> None:
    """Forgets the parent's open stores (registered with os.register_at_fork)."""
