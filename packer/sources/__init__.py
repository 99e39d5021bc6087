"""Input kinds: where the files to pack, their labels and their fields come from.

`packer.plan.scan.scan` composes them. One source lists the image files under SRC (`walk` the folder,
or read a `filelist`); `metadata` can replace folder labels with a file's labels and add its
columns as fields; `classes` fixes the name -> index map; `sidecars` adds fields read from the
files beside each image when it is packed. Every source gives a `Listing`: paths relative to SRC
(each file's key) in sorted order, with labels, sizes and field values. A new input kind is one
module here and one line in `packer.sources.inputs.INPUT_KINDS` (docs/extending.md).
"""
