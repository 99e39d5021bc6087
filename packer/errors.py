"""Errors the CLI turns into one-line messages; each names the file and the problem."""


class PackError(Exception):
    """A packing run cannot go on; nothing already published is touched."""


class RejectedFile(Exception):
    """One input file cannot be packed; it goes to rejects.jsonl with this reason."""


class FinishedOutput(PackError):
    """OUT already holds a published dataset: up to date if packed from the same SRC and options."""
