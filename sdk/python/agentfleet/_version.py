# Written by scripts/sdk-generate: the api crate's version.
__version__ = "0.1.0"
