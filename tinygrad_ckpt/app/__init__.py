"""The `tinygrad-ckpt` command, the figures, the lessons as notebooks and the API page."""
