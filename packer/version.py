"""The package version, in a module of its own: `packer/__init__.py` exposes the API, which imports
the pipeline, which records this version in every manifest."""

__version__ = "0.1.0"
