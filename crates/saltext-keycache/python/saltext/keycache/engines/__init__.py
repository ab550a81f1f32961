"""Salt engines of saltext.keycache (Salt's loader adds this directory)."""
