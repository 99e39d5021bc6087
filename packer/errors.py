"""Errors the CLI turns into one-line messages; each names the file and the problem."""


class PackError(Exception):
    """A packing run cannot go on; nothing already published is touched."""


class RejectedFile(Exception):
    """One input file cannot be packed; it goes to rejects.jsonl with this reason."""
