"""The package version, in a leaf module so that code below the top level can read it without importing it."""

__version__ = "0.1.0.dev0"
