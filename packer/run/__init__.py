"""A run, from its plan to index.json: `pipeline` is `pack` (plan once, hand the shards not yet
done to an engine, publish when every shard has its marker; a rerun resumes), `append` is `pack
--append` (new shards after OUT's, from a plan of their own), and `publish` writes index.json for
either and is `pack merge` after batch tasks, with `descriptors`, the files other loaders look for
beside the shards.
"""
