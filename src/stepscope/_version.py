"""The package's version: a leaf module (it imports nothing), so that any layer may read it without importing
the `stepscope` package's lazy public names."""

__version__ = "0.1.0"
