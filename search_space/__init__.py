"""Search-space definitions (TOML files shipped as package data)."""
