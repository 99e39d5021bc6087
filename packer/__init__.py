"""pack: turn folders of images into LMDB, HDF5 or WebDataset shards."""

__version__ = "0.1.0"
