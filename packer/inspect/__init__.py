"""Inspection: the commands that look at a packed dataset, never change it, and read it only
through `readers`, as training would. `pack info` (`info`) says what the dataset holds, `pack
show` (`show`) draws a contact sheet of it, `pack verify` (`verify`) checks every file against
index.json. Each opens the dataset the same way (`dataset`): its manifest, and for a URL a small
temporary cache, so that a bucket is read shard by shard and never downloaded whole.
"""
