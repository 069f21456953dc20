"""The scheduling core: pure Python + numpy. No I/O beyond reading its own data files,
no torch, no web, no database."""
