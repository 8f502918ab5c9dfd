"""Tools that run beside the trainer, not in the image: the GPU checks and the data preparation
commands (tokenising text, packing chat examples)."""
