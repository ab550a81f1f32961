"""Salt cache modules of saltext.keycache (Salt's loader adds this directory)."""
