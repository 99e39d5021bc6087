"""Planning: from SRC to the tasks, before any sample is packed. `options` holds everything that
changes the packed result (`PackOptions`), `scan` turns SRC into the listing through the input
kinds of `packer.sources`, `order` puts the listing in packing order, `plan` cuts it into shards
and keeps that split in OUT/.pack/ so any process can pack any shard, `partition` says which
shards one task of a batch job owns, and `changes` checks that SRC is still what a plan listed
before a rerun, a resume, a task or an append trusts it.
"""
