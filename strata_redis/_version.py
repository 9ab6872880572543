"""The package's version, written once: ``pyproject.toml`` reads it (hatch's version path)."""

__version__ = "0.1.0"
