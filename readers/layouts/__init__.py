"""One torch-free module per format: the bytes both its writer (in `packer`) and its reader agree on.

Each holds the format's constants and paired encode/parse functions; `readers.formats` names
the layout, writer and dataset of every format. docs/FORMAT.md is the prose version.
"""
