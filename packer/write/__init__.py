"""Writing a shard, the unit of work: `shard.run_shard` packs one shard of the plan in any process
on any machine. `load` reads the shard's source files ahead and turns them into samples through
`validate` (is this file an image we accept?), `encode` (the bytes to store) and `pixels` (the
decoding stores' pixel work); `writers` holds one writer per format behind a base class that owns
shard rollover, counts, hashes and the atomic commit.
"""
