"""Salt runners of saltext.keycache (Salt's loader adds this directory)."""
