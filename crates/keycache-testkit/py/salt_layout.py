"""The mmap_key_* layout options as the test kit's scripts take them
(``--size``, ``--slot-size``, ``--id-size``, ``--max-segment-bytes``): only
those given on the command line are passed on, the others left to Salt's
defaults."""

# (argparse dest, Salt opts key, salt.utils.mmap_cache.MmapCache keyword)
_LAYOUT = (
    ("size", "mmap_key_size", "size"),
    ("slot_size", "mmap_key_slot_size", "slot_size"),
    ("id_size", "mmap_key_id_size", "key_size"),
    ("max_segment_bytes", "mmap_key_max_segment_bytes", "max_segment_bytes"),
)


def _given(args, column):
    out = {}
    for names in _LAYOUT:
        val = getattr(args, names[0], None)
        if val is not None:
            out[names[column]] = val
    return out


def opts(args):
    """The layout options given in ``args``, as Salt's opts keys."""
    return _given(args, 1)


def cache_kwargs(args):
    """The layout options given in ``args``, as ``MmapCache``'s keywords."""
    return _given(args, 2)
