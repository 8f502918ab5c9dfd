"""The trainer's components: data, packing, loss, optimiser, precision, activation checkpointing,
compilation, checkpoints, export, metrics, tracking and validation."""
