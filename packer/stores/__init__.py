"""Stores: where OUT lives. `output` is the one interface the rest of the packer talks to (an
`Output`: a local folder, `LocalOut`, and the `STORES` table that picks one for OUT), `remote_out`
is OUT in a bucket (shards staged locally, then uploaded), `outdir` names every file the packer
keeps in OUT and checks OUT before writing there, and `fsutil` holds the durable file operations
(what is renamed into place is complete and on disk) and the process's memory housekeeping.
"""
